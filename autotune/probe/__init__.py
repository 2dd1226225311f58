"""The child: one trial in one process (`python -m autotune.probe CONFIG.json`).

Only `device` differs by device kind.
"""
