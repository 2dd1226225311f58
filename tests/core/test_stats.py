from __future__ import annotations

import dataclasses
import math

import pytest
from helpers import GIB, cand

from autotune.core.stats import StepStats, combine, pooled, quiet_step_s, speed_ratio
from autotune.core.trial import Outcome, TrialRecord, TrialResult
from autotune.tuning.selection import select_best

LIMIT = 4 * GIB


def run(step_times: list[float], peak_gib: float = 1.0, batch: int = 16) -> TrialResult:
    stats = StepStats.of(step_times)
    return TrialResult(
        Outcome.OK,
        samples_per_s=batch / stats.median_s,
        tokens_per_s=batch / stats.median_s * 100,
        step_time_median_s=stats.median_s,
        step_time_spread=stats.spread,
        step_time_quiet_s=stats.quiet_s,
        step_times_s=tuple(step_times),
        peak_memory_bytes=int(peak_gib * GIB),
    )


def test_a_slow_spell_inside_a_probe_does_not_rank_the_config_by_it() -> None:
    """Recorded on this 2-core machine (t5, 8x2, a search's probes): bf16 Adafactor's
    probe caught the host's other work from its fifth step; fp32 fused AdamW's did not.
    Quiet, bf16 runs 86-93 ms a step against fp32's 98-106, and it is the one selected;
    its figures as measured (the median) are what is kept and shown."""
    ms = 1e-3
    bf16 = run([x * ms for x in (88, 93, 86, 89, 103, 131, 135, 132, 139, 127)], peak_gib=0.5)
    fp32 = run([x * ms for x in (106, 98, 102, 102, 110, 117, 111, 112, 114, 100)])
    assert bf16.samples_per_s < fp32.samples_per_s  # by the median, fp32 would win
    records = [TrialRecord(1, cand(8, "bf16"), bf16), TrialRecord(2, cand(8), fp32)]
    best = select_best(records, fit_limit_bytes=LIMIT)
    assert best.number == 1
    assert best.result.samples_per_s == 16 / best.result.step_time_median_s


def test_one_fast_step_does_not_make_a_config_the_fastest() -> None:
    """A lower quartile, not the fastest step: one step at half the time (a timer's
    hiccup) among five or more moves it no more than the median, and three steps rank
    as four do (no jump from the median to a quartile as a window grows)."""
    steady = run([0.95] * 10)
    for steps in (5, 10):
        hiccup = run([1.0] * (steps - 1) + [0.5])
        assert quiet_step_s(hiccup) == 1.0
        records = [TrialRecord(1, cand(16), hiccup), TrialRecord(2, cand(16, "bf16"), steady)]
        assert select_best(records, fit_limit_bytes=LIMIT).number == 2
    three, four = run([1.0, 1.025, 1.05]), run([1.0, 1.025, 1.05, 1.05])
    assert abs(quiet_step_s(four) / quiet_step_s(three) - 1) < 0.01


def test_an_older_studys_result_is_ranked_from_its_step_times() -> None:
    """Results stored before the quiet step time existed carry their steps: derived from
    them; with real batches of varying length (--dataset) the median ranks."""
    older = run([1.0, 1.0, 1.0, 2.0, 2.0]).replace(step_time_quiet_s=None)
    assert older.step_time_median_s == 1.0 and quiet_step_s(older) == 1.0
    slow_spell = run([1.0, 1.0, 2.0, 2.0, 2.0]).replace(step_time_quiet_s=None)
    assert quiet_step_s(slow_spell) == 1.0
    real_batches = slow_spell.replace(worst_case_samples_per_s=8.0)
    assert quiet_step_s(real_batches) == 2.0


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
    # ranked by the mean of each run's quiet time: the quick run does not outvote
    assert confirmed[0].result.step_time_quiet_s == pytest.approx((0.805 + 1.2925) / 2)


def test_combined_figures_pool_every_step_and_keep_the_highest_peak() -> None:
    first, second = run([1.0, 1.0, 1.0], peak_gib=1.0), run([2.0] * 6, peak_gib=1.5)
    both = combine(first, [second])
    assert len(both.step_times_s) == 9
    assert both.step_time_median_s == 2.0
    assert both.samples_per_s == 8.0 and both.tokens_per_s == 800.0
    assert both.peak_memory_bytes == int(1.5 * GIB)
    assert both.step_time_spread == (2.0 - 1.0) / 2.0


def test_the_most_subnormal_run_of_a_config_is_the_one_its_export_reads() -> None:
    """Whether the export says to flush subnormals does not hang on which run came first:
    the run that left the most, with the CPU timing it took, whichever was pooled."""
    probe = run([1.0] * 3).replace(subnormal_share=0.02, subnormal_slowdown=150.0)
    alone = run([1.0] * 3).replace(subnormal_share=0.004, subnormal_slowdown=None)
    both = combine(alone, [probe])
    assert (both.subnormal_share, both.subnormal_slowdown) == (0.02, 150.0)
    unread = combine(run([1.0] * 3), [run([1.0] * 3)])
    assert (unread.subnormal_share, unread.subnormal_slowdown) == (None, None)


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


def test_a_speed_ratio_carries_the_range_its_step_times_allow() -> None:
    fast = TrialResult(Outcome.OK, step_times_s=(0.10, 0.11, 0.10, 0.12, 0.10))
    slow = TrialResult(Outcome.OK, step_times_s=(0.20, 0.22, 0.21, 0.20, 0.25))
    ratio = speed_ratio(fast, slow)
    assert ratio is not None and math.isclose(ratio.value, 0.21 / 0.10)
    assert ratio.low < ratio.value < ratio.high and not ratio.tie
    assert math.isclose(ratio.low, 0.20 / 0.11) and math.isclose(ratio.high, 0.22 / 0.10)
    assert ratio.describe().startswith("2.10x (1.82-2.20x")


def test_two_steps_allow_their_whole_range_not_half_of_it() -> None:
    """A probe under a very short budget times two steps: interpolated quartiles would
    claim half their range, so a 6% lead read on two steps a 10% apart would look
    clear of a tie; their range holds 1."""
    fast = TrialResult(Outcome.OK, step_times_s=(0.100, 0.110))
    slow = TrialResult(Outcome.OK, step_times_s=(0.106, 0.116))
    ratio = speed_ratio(fast, slow)
    assert ratio is not None
    assert math.isclose(ratio.low, 0.106 / 0.110) and math.isclose(ratio.high, 0.116 / 0.100)
    assert ratio.tie


def test_a_ratio_whose_range_holds_one_is_a_tie() -> None:
    a = TrialResult(Outcome.OK, step_times_s=(0.10, 0.13, 0.10, 0.12))
    b = TrialResult(Outcome.OK, step_times_s=(0.11, 0.10, 0.12, 0.11))
    ratio = speed_ratio(a, b)
    assert ratio is not None and ratio.tie and "a tie within the noise" in ratio.describe()
    assert speed_ratio(a, TrialResult(Outcome.OOM)) is None


def test_paired_rounds_give_an_interval_that_narrows_as_rounds_are_added() -> None:
    """Each round's pair is one ratio; their geometric mean has a repeated 95% interval over the
    rounds. The pooled quartiles of the same steps do not narrow with more of them."""
    from autotune.core.stats import paired_ratio

    a = ((0, 0.90), (1, 0.92), (2, 0.91))
    b = ((0, 1.00), (1, 1.01), (2, 1.00), (5, 3.0))  # round 5: A has none, unpaired
    three = paired_ratio(a, b)
    assert three is not None and three.rounds == 3
    assert three.low > 1.0 and 1.09 < three.value < 1.11 and not three.tie
    assert "over 3 paired rounds" in three.describe()
    assert paired_ratio(a[:1], b) is None  # one round: no interval
    two = paired_ratio(a[:2], b)
    assert two is not None and two.high - two.low > three.high - three.low


def test_student_t_matches_the_printed_tables() -> None:
    from autotune.core.stats import t_quantile

    printed = {(0.05, 1): 12.706, (0.05, 2): 4.303, (0.05, 3): 3.182, (0.05, 4): 2.776}
    printed |= {(0.05, 9): 2.262, (0.01, 5): 4.032, (0.01, 30): 2.750, (0.05, 120): 1.980}
    printed |= {(0.0086, 1): 74.021}  # the repeated interval's first look: two rounds
    for (level, df), t in printed.items():
        assert t_quantile(level, df) == pytest.approx(t, abs=5e-4)


def test_the_paired_interval_read_after_every_round_holds_the_truth_95_percent_of_the_time() -> (
    None
):
    """The duel reads the interval after each of up to 16 rounds and stops at the first
    that decides: the truth must lie in every one of them in 95% of duels, not in each."""
    import random

    from autotune.core.stats import paired_ratio

    rng, missed, duels = random.Random(0), 0, 2000
    for _ in range(duels):
        fast = tuple((r, math.exp(rng.gauss(0.0, 0.08))) for r in range(16))
        slow = tuple((r, 1.0) for r in range(16))
        for looks in range(2, 17):
            ratio = paired_ratio(fast[:looks], slow[:looks])
            assert ratio is not None
            if not ratio.low <= 1.0 <= ratio.high:
                missed += 1
                break
    assert 0.03 < missed / duels < 0.07
