"""Ranking at one host speed: a run in a slow spell of the host is not taken for a slow
config, and what was measured is never changed."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import cand

from autotune.core import host_speed
from autotune.core.host_speed import MOST, at_reference, pooled_speed, reference, step_factor
from autotune.core.trial import Outcome, TrialRecord, TrialResult

FAST, SLOW = 200e9, 115e9  # fp32 multiply FLOP/s in the two spells seen on the 2-core VM


def measured(number: int, step_s: float, host: float | None, batch: int = 16) -> TrialRecord:
    result = TrialResult(Outcome.OK, samples_per_s=batch / step_s, step_time_median_s=step_s,
                         step_times_s=(step_s,) * 5, one_time_s=2.0,
                         host_flops_per_s=host)  # fmt: skip
    return TrialRecord(number, cand(16), result)


def test_a_step_measured_in_a_slow_spell_is_ranked_shorter_and_one_in_a_fast_spell_longer() -> None:
    assert step_factor(SLOW, 150e9) < 1.0 < step_factor(FAST, 150e9)
    assert step_factor(150e9, 150e9) == 1.0
    # the fitted power: a host 1.74x faster runs a step 1.47x faster, not 1.74x
    assert step_factor(FAST, SLOW) == pytest.approx((FAST / SLOW) ** host_speed.ALPHA)


def test_no_run_is_scaled_by_more_than_the_bound_and_an_unknown_speed_not_at_all() -> None:
    assert step_factor(1e9, 150e9) == pytest.approx(1 / MOST)
    assert step_factor(1e15, 150e9) == pytest.approx(MOST)
    assert step_factor(None, 150e9) == step_factor(SLOW, None) == 1.0


def test_the_reference_is_the_median_speed_of_the_runs_that_measured_it() -> None:
    oom = TrialRecord(4, cand(32), TrialResult(Outcome.OOM, host_flops_per_s=1e9))
    records = [measured(0, 1.0, FAST), measured(1, 1.0, SLOW), measured(2, 1.0, 150e9),
               measured(3, 1.0, None), oom]  # fmt: skip
    assert reference(records) == 150e9
    assert reference([measured(0, 1.0, None)]) is None


def test_one_config_measured_in_two_spells_ranks_closer_and_keeps_its_figures() -> None:
    fast, slow = measured(0, 1.0, FAST), measured(1, 1.42, SLOW)  # 42% apart as measured
    ranked_fast, ranked_slow = at_reference([fast, slow])
    ref = (FAST + SLOW) / 2  # the median of two
    assert ranked_slow.result.step_time_median_s == pytest.approx(1.42 * (SLOW / ref) ** 0.7)
    gap = ranked_slow.result.step_time_median_s / ranked_fast.result.step_time_median_s
    assert 0.95 < gap < 1.05  # 42% apart as measured, within 5% at one host speed
    assert ranked_slow.result.samples_per_s == pytest.approx(
        16 / ranked_slow.result.step_time_median_s
    )
    assert ranked_slow.result.step_times_s == pytest.approx(
        (ranked_slow.result.step_time_median_s,) * 5
    )
    assert ranked_slow.result.one_time_s < 2.0  # every time, at the reference speed
    assert (fast.result.step_time_median_s, slow.result.step_time_median_s) == (1.0, 1.42)


def test_records_without_the_speed_rank_as_measured() -> None:
    cuda = [measured(0, 1.0, None), measured(1, 2.0, None)]
    assert at_reference(cuda) == cuda
    mixed = [measured(0, 1.0, None), measured(1, 1.0, SLOW), measured(2, 1.0, FAST)]
    assert at_reference(mixed)[0] == mixed[0]


def test_pooled_runs_carry_the_speed_of_their_steps() -> None:
    long = dataclasses.replace(measured(0, 1.0, FAST).result, step_times_s=(1.0,) * 9)
    short = dataclasses.replace(measured(1, 1.0, SLOW).result, step_times_s=(1.0,) * 3)
    speed = pooled_speed([long, short])
    assert speed == pytest.approx(FAST**0.75 * SLOW**0.25)  # weighted by steps
    assert pooled_speed([long, measured(2, 1.0, None).result]) is None
