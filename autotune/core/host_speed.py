"""Step times ranked at one host speed: a shared CPU host drifts (issue #15).

On the 2-core VM the families benchmark runs on, the same config measured a minute
apart differs by 30-40% (t5: 8x2 bf16 fused AdamW at 136, then 99 samples/s), and the
search ranked configs measured in a fast spell above better ones measured in a slow
spell. An fp32 matrix multiply timed in the same process follows the drift: over the 30
runs of the 7 fp32 configs measured more than once in that benchmark's studies, the
spread of log samples/s about each config's mean fell from 0.164 to 0.088 once scaled
by the multiply's speed to the power ALPHA (0.6-0.75 fitted equally well).

So each CPU probe times that multiply before and after its steps (`host_flops_per_s`,
their geometric mean), and ranking compares step times scaled to the study's median
host speed: selection, the incumbent a probe is measured against, and the model of step
time. A run's own figures are never changed: exports, reports and the study keep what
was measured. A record without the figure (CUDA, where no such drift was seen; a study
written before) is ranked as measured.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from autotune.core.enums import Outcome
from autotune.core.trial import TrialRecord, TrialResult

ALPHA = 0.7  # step time ~ host speed ** -ALPHA (fitted, see the module docstring)
MOST = 1.5  # no run is scaled by more than this factor either way


def reference(records: Sequence[TrialRecord]) -> float | None:
    """The study's host speed: the median over its measured runs (None without one)."""
    speeds = [r.result.host_flops_per_s for r in records
              if r.result.outcome == Outcome.OK and r.result.host_flops_per_s]  # fmt: skip
    return float(statistics.median(speeds)) if speeds else None


def step_factor(host_flops_per_s: float | None, reference_flops_per_s: float | None) -> float:
    """What a step time measured at this host speed is multiplied by to be ranked at the
    reference speed: below 1 for a run in a slow spell. 1 where either is unknown."""
    if not host_flops_per_s or not reference_flops_per_s:
        return 1.0
    factor = float((host_flops_per_s / reference_flops_per_s) ** ALPHA)
    return min(MOST, max(1.0 / MOST, factor))


def scaled(result: TrialResult, factor: float) -> TrialResult:
    """The result's times multiplied by `factor` (its rates divided by it)."""
    if factor == 1.0:
        return result

    def time(value: float | None) -> float | None:
        return None if value is None else value * factor

    def rate(value: float | None) -> float | None:
        return None if value is None else value / factor

    return dataclasses.replace(
        result,
        samples_per_s=rate(result.samples_per_s),
        tokens_per_s=rate(result.tokens_per_s),
        model_flops_per_s=rate(result.model_flops_per_s),
        step_time_median_s=time(result.step_time_median_s),
        step_times_s=tuple(t * factor for t in result.step_times_s),
        one_time_s=time(result.one_time_s),
    )


def at_reference(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The records as ranking sees them: each run's times at the study's host speed."""
    ref = reference(records)
    if ref is None:
        return list(records)
    return [
        dataclasses.replace(r, result=scaled(r.result, step_factor(r.result.host_flops_per_s, ref)))
        for r in records
    ]


def pooled_speed(runs: Sequence[TrialResult]) -> float | None:
    """The host speed of runs whose step times are pooled: their geometric mean, each
    weighted by its steps (None when a run lacks the figure)."""
    pairs = [(r.host_flops_per_s, max(1, len(r.step_times_s))) for r in runs]
    if not pairs or any(not speed for speed, _ in pairs):
        return None
    total = sum(n for _, n in pairs)
    return math.exp(sum(n * math.log(speed or 1.0) for speed, n in pairs) / total)
