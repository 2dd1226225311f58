"""The child: one trial in one process (`python -m autotune.probe CONFIG.json`).

Only `device` differs by device kind. Module names here are a protocol between
processes and stay public: `python -m autotune.probe` runs a trial, `python -m
autotune.probe.job` surveys the user's job, and the fork server imports `main` (whose
`main()` runs a forked trial), `timing`, `data`, `flops`, `device` and `fork_pages` by
name before it forks. A public name imports its module (and torch) on first use, so
importing the package alone stays cheap. `_train`, `_parity` and `_cuda_context` are
the trial's inside.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._exports import lazy_exports

if TYPE_CHECKING:
    from autotune.probe._inputs import Measurement
    from autotune.probe._train import schedule_of
    from autotune.probe.data import WorstCaseDataset
    from autotune.probe.flops import measure_peak_flops
    from autotune.probe.ranks import RESULT_NAME, merge_ranks
    from autotune.probe.shared_model import SharedModel

__all__ = [
    "RESULT_NAME",
    "Measurement",
    "SharedModel",
    "WorstCaseDataset",
    "measure_peak_flops",
    "merge_ranks",
    "schedule_of",
]

# each public name, and the module that holds it
_OWNERS = {
    "Measurement": "autotune.probe._inputs",
    "schedule_of": "autotune.probe._train",
    "WorstCaseDataset": "autotune.probe.data",
    "measure_peak_flops": "autotune.probe.flops",
    "RESULT_NAME": "autotune.probe.ranks",
    "merge_ranks": "autotune.probe.ranks",
    "SharedModel": "autotune.probe.shared_model",
}
__getattr__ = lazy_exports(__name__, _OWNERS)
