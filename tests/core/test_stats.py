from __future__ import annotations

import dataclasses

from helpers import GIB, cand

from autotune.core.stats import combine, pooled
from autotune.core.trial import Outcome, TrialRecord, TrialResult
from autotune.search.selection import select_best

LIMIT = 4 * GIB


def run(step_times: list[float], peak_gib: float = 1.0, batch: int = 16) -> TrialResult:
    median = sorted(step_times)[len(step_times) // 2]
    return TrialResult(
        Outcome.OK,
        samples_per_s=batch / median,
        tokens_per_s=batch / median * 100,
        step_time_median_s=median,
        step_time_spread=0.0,
        step_times_s=tuple(step_times),
        peak_memory_bytes=int(peak_gib * GIB),
    )


def test_a_config_that_was_lucky_once_does_not_win() -> None:
    lucky = run([0.80, 0.82, 0.81])  # 19.8 samples/s once...
    lucky_again = run([1.30, 1.35, 1.28, 1.33, 1.31, 1.29])  # ...then 12 when measured longer
    steady = run([1.0, 1.01, 0.99])
    steady_again = run([1.0, 1.02, 0.98, 1.0, 1.01, 0.99])
    unconfirmed = [TrialRecord(1, cand(16), lucky), TrialRecord(2, cand(16, "bf16"), steady)]
    assert select_best(unconfirmed, fit_limit_bytes=LIMIT).number == 1
    confirmed = [
        TrialRecord(1, cand(16), combine(lucky, [lucky_again]), runs=2),
        TrialRecord(2, cand(16, "bf16"), combine(steady, [steady_again]), runs=2),
    ]
    assert select_best(confirmed, fit_limit_bytes=LIMIT).number == 2


def test_combined_figures_pool_every_step_and_keep_the_highest_peak() -> None:
    first, second = run([1.0, 1.0, 1.0], peak_gib=1.0), run([2.0] * 6, peak_gib=1.5)
    both = combine(first, [second])
    assert len(both.step_times_s) == 9
    assert both.step_time_median_s == 2.0
    assert both.samples_per_s == 8.0 and both.tokens_per_s == 800.0
    assert both.peak_memory_bytes == int(1.5 * GIB)
    assert both.step_time_spread == (2.0 - 1.0) / 2.0


def test_a_failed_confirmation_takes_the_config_out() -> None:
    oom = TrialResult(Outcome.OOM, reason="out of memory", peak_memory_bytes=5 * GIB)
    both = combine(run([1.0] * 3), [oom])
    assert both.outcome == Outcome.OOM and both.reason.startswith("confirmation run")
    record = TrialRecord(1, cand(16), both, runs=2)
    assert select_best([record], fit_limit_bytes=LIMIT) is None


def test_no_confirmation_leaves_the_result_alone() -> None:
    only = run([1.0, 1.1, 0.9])
    assert combine(only, []) == only
    assert dataclasses.replace(only) == combine(only, [])


def test_runs_measured_side_by_side_are_not_pooled_with_runs_measured_alone() -> None:
    shared = dataclasses.replace(run([2.0, 2.1, 2.0], peak_gib=1.5), concurrent=2)
    alone = run([1.0, 1.1, 1.0, 1.0])
    assert pooled(shared, [alone]) == [alone]
    pooled_result = combine(shared, [alone])
    assert pooled_result.step_times_s == alone.step_times_s
    assert pooled_result.samples_per_s == 16 / 1.0
    assert pooled_result.peak_memory_bytes == int(1.5 * GIB)  # the highest peak of every run
    assert pooled(shared, []) == [shared]  # nothing measured alone yet: what there is
