"""The search's own logic: the study loop, skips, selection, the estimate, workers.

The model of step time (`_propose`), the skips (`_skips`) and the memory verdict
(`_memory_verdict`) are the study loop's inside. A public name imports its module on
first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._exports import lazy_exports

if TYPE_CHECKING:
    from autotune.tuning._memory_verdict import predicted_peak, process_bytes, spec_breakdown
    from autotune.tuning.deadline import Deadline
    from autotune.tuning.estimate import Estimate, estimate_rows, static_bytes
    from autotune.tuning.limits import SearchLimits
    from autotune.tuning.options import SearchOptions
    from autotune.tuning.outcome import SearchOutcome, SearchReport
    from autotune.tuning.parity import reference_candidate, reference_for
    from autotune.tuning.plan import Layout, build_spec, workload_defaults
    from autotune.tuning.resolve import DataOptions, Facts
    from autotune.tuning.run import SearchRun, prepare_store, run_search
    from autotune.tuning.selection import (
        fitting,
        noise_band,
        nothing_fits,
        plain_default,
        ranked,
        ranked_sps,
        select_best,
        select_for,
    )
    from autotune.tuning.time_plan import plan_for_budget
    from autotune.tuning.workers import WorkerJob, confine, run_workers

__all__ = [
    "DataOptions",
    "Deadline",
    "Estimate",
    "Facts",
    "Layout",
    "SearchLimits",
    "SearchOptions",
    "SearchOutcome",
    "SearchReport",
    "SearchRun",
    "WorkerJob",
    "build_spec",
    "confine",
    "estimate_rows",
    "fitting",
    "noise_band",
    "nothing_fits",
    "plain_default",
    "plan_for_budget",
    "predicted_peak",
    "prepare_store",
    "process_bytes",
    "ranked",
    "ranked_sps",
    "reference_candidate",
    "reference_for",
    "run_search",
    "run_workers",
    "select_best",
    "select_for",
    "spec_breakdown",
    "static_bytes",
    "workload_defaults",
]

# each public name, and the module that holds it
_OWNERS = {
    "predicted_peak": "autotune.tuning._memory_verdict",
    "process_bytes": "autotune.tuning._memory_verdict",
    "spec_breakdown": "autotune.tuning._memory_verdict",
    "Deadline": "autotune.tuning.deadline",
    "Estimate": "autotune.tuning.estimate",
    "estimate_rows": "autotune.tuning.estimate",
    "static_bytes": "autotune.tuning.estimate",
    "SearchLimits": "autotune.tuning.limits",
    "SearchOptions": "autotune.tuning.options",
    "SearchOutcome": "autotune.tuning.outcome",
    "SearchReport": "autotune.tuning.outcome",
    "reference_candidate": "autotune.tuning.parity",
    "reference_for": "autotune.tuning.parity",
    "DataOptions": "autotune.tuning.resolve",
    "Facts": "autotune.tuning.resolve",
    "Layout": "autotune.tuning.plan",
    "build_spec": "autotune.tuning.plan",
    "workload_defaults": "autotune.tuning.plan",
    "SearchRun": "autotune.tuning.run",
    "prepare_store": "autotune.tuning.run",
    "run_search": "autotune.tuning.run",
    "fitting": "autotune.tuning.selection",
    "noise_band": "autotune.tuning.selection",
    "nothing_fits": "autotune.tuning.selection",
    "plain_default": "autotune.tuning.selection",
    "ranked": "autotune.tuning.selection",
    "ranked_sps": "autotune.tuning.selection",
    "select_best": "autotune.tuning.selection",
    "select_for": "autotune.tuning.selection",
    "plan_for_budget": "autotune.tuning.time_plan",
    "WorkerJob": "autotune.tuning.workers",
    "confine": "autotune.tuning.workers",
    "run_workers": "autotune.tuning.workers",
}
__getattr__ = lazy_exports(__name__, _OWNERS)
