"""autotune: find the fastest Trainer configuration that fits in memory, by measurement.

`autotune.search(job, memory_budget="16GiB", time_budget="10m", ...)` runs a search
from Python, down the path `autotune search` takes, and returns its `SearchOutcome`;
`autotune.load(study)` gives a study's tuned TrainingArguments fields. They are loaded
on first use: a probe process, which imports this package, does not pay for the
search's modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._exports import lazy_exports

if TYPE_CHECKING:
    from autotune.api import load, search
    from autotune.tuning.outcome import SearchOutcome

__version__ = "0.1.0"
__all__ = ["SearchOutcome", "__version__", "load", "search"]

# PEP 562: the public API, imported when first used
__getattr__ = lazy_exports(
    __name__,
    {"load": "autotune.api", "search": "autotune.api", "SearchOutcome": "autotune.tuning.outcome"},
)
