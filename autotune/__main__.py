from __future__ import annotations

from autotune.cli import run

run()
