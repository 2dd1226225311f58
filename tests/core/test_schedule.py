"""Adaptive measurement's rules (core/schedule.py), on invented series where the rule is
the point and on recorded ones (benchmarks/step_series.json) where the data is."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from autotune.core.schedule import Schedule

SERIES = Path(__file__).parents[2] / "benchmarks" / "step_series.json"


def warmup_of(schedule: Schedule, durations: list[float]) -> int | None:
    """Warm-up as the live timer finds it: asked after each step."""
    for n in range(len(durations) + 1):
        found = schedule.warmup_steps(durations[:n])
        if found is not None:
            return found
    return None


def test_warm_up_ends_at_the_first_steady_step() -> None:
    schedule = Schedule(max_warmup=5, max_measure=5)
    # durations from step 2 on: steps 3 and 4 agree within 10%, so steps 1-2 are warm-up
    assert warmup_of(schedule, [4.0, 3.0, 3.1, 3.0]) == 2
    # a compiled model: slow first steps, then steady from step 4
    assert warmup_of(schedule, [30.0, 9.0, 3.2, 3.1, 3.0]) == 3
    # at most 3 steps of warm-up: known once step 4 is in (steps 3 and 4 agree here)
    assert warmup_of(Schedule(max_warmup=3, max_measure=5), [4.0, 3.0, 3.1]) == 2
    assert warmup_of(Schedule(max_warmup=3, max_measure=5), [4.0, 3.0, 2.0]) == 3
    # one step the host caught between two that agree: steady from the first of them,
    # known as soon as the third is in (two in a row would have waited for steps 5 and 6)
    assert warmup_of(Schedule(max_warmup=3, max_measure=3), [5.0, 5.7, 5.1]) == 1
    assert Schedule(max_warmup=3, max_measure=3).warmup_steps([5.0, 5.7]) is None
    # never steady: the most warm-up allowed
    assert warmup_of(schedule, [8.0, 4.0, 2.0, 1.0, 0.5, 0.4]) == 5
    assert schedule.warmup_steps([8.0, 4.0, 2.0]) is None  # not known yet


def test_a_calibrating_loss_scale_is_never_steady() -> None:
    schedule = Schedule(max_warmup=6, max_measure=5)
    skipped_fast = [0.5, 0.5, 3.0, 3.0]  # steps 2-3 skipped by the scaler: fast and alike
    assert schedule.warmup_steps(skipped_fast[:2], calibrating=True) is None
    assert schedule.warmup_steps(skipped_fast, calibration_steps=3) == 3  # steps 4-5 agree
    # a calibration longer than the most warm-up allowed: still none of it is timed
    short = Schedule(max_warmup=3, max_measure=5)
    long_run = [0.5, 0.5, 0.5, 0.5, 3.0, 3.1]  # steps 1-5 skipped, then 6 and 7 agree
    assert short.warmup_steps(long_run[:4], calibrating=True) is None
    assert short.warmup_steps(long_run, calibration_steps=5) == 5


def test_one_slow_step_is_enough_to_drop_a_clearly_slower_candidate() -> None:
    schedule = Schedule(max_warmup=3, max_measure=8, incumbent_s=2.0)
    assert schedule.stop_reason([2.6]) == "clearly slower than the best so far"
    assert schedule.stop_reason([2.4]) == ""  # 20% over: not clear from one step
    # three tight steps 20% over: ranked, and below it
    assert schedule.stop_reason([2.4, 2.41]) == ""  # two steps: not yet
    assert schedule.stop_reason([2.4, 2.41, 2.42]) == "slower than the best so far"


def test_a_contender_is_measured_until_its_band_is_tight() -> None:
    schedule = Schedule(max_warmup=3, max_measure=8, incumbent_s=2.0)
    assert schedule.stop_reason([1.9, 2.3]) == ""  # a wide band around the incumbent
    assert schedule.stop_reason([1.9, 2.3, 2.0, 1.98, 2.02]) == ""
    assert schedule.stop_reason([1.99, 2.01, 2.0]) == "level with the best so far"
    assert schedule.stop_reason([1.5, 1.52, 1.51]) == "faster than the best so far"
    assert schedule.stop_reason([1.9, 2.3, 2.0, 1.98, 2.02, 2.2, 1.8, 2.1]) == "full window"
    first = Schedule(max_warmup=3, max_measure=8)  # nothing to rank against yet
    assert first.stop_reason([3.0, 3.05, 3.02]) == "steady"
    assert first.stop_reason([3.0, 3.5, 3.2]) == ""


def test_a_window_most_of_whose_steps_stalled_is_not_closed() -> None:
    # A search's first probe (no incumbent, --measure-steps 3): two of its three steps
    # were caught by another process; its median made the config look 3.6x slower.
    first = Schedule(max_warmup=2, max_measure=3, min_window_s=1.0, most=20)
    assert first.stop_reason([4.154, 0.504, 0.141]) == ""
    assert first.stop_reason([4.154, 0.504, 0.141, 0.140]) == ""
    assert first.stop_reason([4.154, 0.504, 0.141, 0.140, 0.142]) == "full window"
    # One slow step among three moves the median little: the window closes as before.
    assert first.stop_reason([1.5, 0.5, 0.49]) == "full window"
    # However stalled, `most` steps end it.
    assert first.stop_reason([4.0] * 11 + [0.1] * 9) == "full window"


def test_fast_steps_are_measured_for_a_time_before_any_window_closes() -> None:
    # 80 ms steps with two slow ones among the first three: three are a third of a
    # second, so the window stays open until a second of steps (12) is in
    schedule = Schedule(max_warmup=3, max_measure=3, incumbent_s=0.09, min_window_s=1.0, most=20)
    steps = [0.08, 0.14, 0.13] + [0.08] * 17
    stops = [schedule.stop_reason(steps[:n]) for n in range(1, 21)]
    assert stops[:11] == [""] * 11  # neither the full window nor a tight band closes it
    assert stops[11] == "full window" and sum(steps[:12]) >= 1.0
    # ranked by the median of twelve steps (80 ms), not of three (130 ms: a loss)
    assert sorted(steps[:12])[5:7] == [0.08, 0.08]
    # a tight contender too is timed for the whole second
    tight = [schedule.stop_reason([0.08] * n) for n in (3, 12, 13)]
    assert tight == ["", "", "full window"]
    # the clearly slower still stop at once, and `most` steps end the window in any case
    assert schedule.stop_reason([0.2]) == "clearly slower than the best so far"
    capped = Schedule(max_warmup=3, max_measure=3, min_window_s=10.0, most=5)
    assert [capped.stop_reason([0.1] * n) for n in (3, 4, 5)] == ["", "", "full window"]
    # slow steps: the window is long enough at max_measure, as before
    slow = Schedule(max_warmup=3, max_measure=8, incumbent_s=2.0, min_window_s=1.0, most=20)
    assert slow.stop_reason([1.5, 1.52, 1.51]) == "faster than the best so far"


def test_with_the_users_run_length_a_one_time_cost_is_weighed_by_it() -> None:
    # the incumbent finishes 100 steps in 300 s; a compiled candidate steps in 2 s but
    # paid 90 s once: 290 s, not slower; with 200 s once, 400 s: clearly slower
    schedule = Schedule(max_warmup=3, max_measure=8, incumbent_s=300.0, train_steps=100)
    assert schedule.stop_reason([2.0], one_time_s=90.0) == ""
    assert schedule.stop_reason([2.0], one_time_s=200.0) == "clearly slower than the best so far"


def replay(
    series: list[list[float]], *, max_warmup: int, max_measure: int
) -> tuple[list[float], list[str], int]:
    """A search's probes in this order: each measured against the best so far.
    Returns each config's measured median, why it stopped, and the steps timed."""
    incumbent: float | None = None
    medians, stops, steps = [], [], 0
    for durations in series:
        schedule = Schedule(max_warmup=max_warmup, max_measure=max_measure, incumbent_s=incumbent)
        warmup = warmup_of(schedule, durations)
        assert warmup is not None
        measured: list[float] = []
        stop = ""
        for step in durations[warmup - 1 :]:
            measured.append(step)
            stop = schedule.stop_reason(measured)
            if stop:
                break
        medians.append(statistics.median(measured))
        stops.append(stop)
        steps += warmup + len(measured)
        incumbent = min(medians)
    return medians, stops, steps


@pytest.mark.skipif(not SERIES.exists(), reason="run benchmarks/step_series.py --record")
@pytest.mark.parametrize("model", ["t5-small", "gpt2"])
def test_early_stopping_keeps_the_config_a_full_measurement_selects(model: str) -> None:
    """On recorded step times of every config of a small space, probed in many orders:
    the config the full fixed window (3 warm-up, 12 timed) ranks fastest is never
    dropped as clearly slower, and what adaptive measurement selects is it or ties it
    (within 3%: a tie counts as found); and it times far fewer steps."""
    recorded = [c["durations"] for c in json.loads(SERIES.read_text())["models"][model]]
    full = [statistics.median(d[2:14]) for d in recorded]
    best = min(full)
    orders = [list(range(len(recorded)))]
    rng = random.Random(0)
    orders += [rng.sample(orders[0], len(recorded)) for _ in range(200)]
    spent, whole = 0, 15 * len(recorded)
    for order in orders:
        medians, stops, steps = replay([recorded[i] for i in order], max_warmup=3, max_measure=12)
        winner = order[medians.index(min(medians))]
        position = order.index(full.index(best))
        assert "clearly" not in stops[position], (order, stops[position])
        assert full[winner] <= best * 1.03, (order, full[winner], best)
        spent += steps
    assert spent / len(orders) < 0.6 * whole
