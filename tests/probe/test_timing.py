"""The step timer's rules, driven step by step with a fake clock and a fake scaler."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from autotune.core.schedule import Schedule
from autotune.probe.timing import MIN_FAST_STEPS, StepTimer


class Clock:
    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def run(timer: StepTimer, steps: int, skipped: set[int] | None = None) -> int:
    """Drive `steps` optimizer steps; returns how many ran before the timer stopped it."""
    control = SimpleNamespace(should_training_stop=False)
    for step in range(1, steps + 1):
        timer.on_step_begin(None, None, control)
        optimizer = SimpleNamespace(step_was_skipped=step in (skipped or set()))
        timer.on_step_end(None, None, control, optimizer=optimizer)
        if control.should_training_stop:
            return step
    return steps


def test_a_fixed_window_keeps_the_steps_after_warm_up() -> None:
    timer = StepTimer(device_kind="cpu", warmup_steps=2, measure_steps=3, clock=Clock(0.1))
    assert run(timer, 5) == 5
    assert len(timer.measured_step_times()) == 3


def test_a_time_window_closes_at_enough_time_and_enough_steps() -> None:
    # 62.5 ms steps: 2 s of window is 32 measured steps, more than MIN_FAST_STEPS.
    timer = StepTimer(
        device_kind="cpu", warmup_steps=2, measure_steps=5, min_window_s=2.0, clock=Clock(0.0625)
    )
    ran = run(timer, 500)
    assert ran - 2 == 32
    assert len(timer.measured_step_times()) == 32
    # Slow steps: time is there at once, the step floor holds the window open.
    slow = StepTimer(
        device_kind="cpu", warmup_steps=1, measure_steps=5, min_window_s=2.0, clock=Clock(1.0)
    )
    assert run(slow, 500) - 1 == MIN_FAST_STEPS


def test_the_initial_scale_calibration_is_not_instability() -> None:
    timer = StepTimer(device_kind="cpu", warmup_steps=2, measure_steps=4, clock=Clock(0.1))
    run(timer, 6, skipped={1, 2, 3})  # a calibration streak running past warm-up
    assert timer.calibration_steps == 3 and timer.skipped_in_window == 0
    later = StepTimer(device_kind="cpu", warmup_steps=2, measure_steps=4, clock=Clock(0.1))
    run(later, 6, skipped={1, 5})  # a skip after a good step is a real one
    assert later.skipped_in_window == 1


def test_a_falling_loss_scale_is_a_skipped_step_even_for_fused_adamw() -> None:
    """Fused AdamW takes the scale into its own step, so accelerate never reports the
    skip; the scaler halving its scale does."""
    scales = iter([65536.0, 65536.0, 65536.0, 32768.0, 32768.0])
    scaler = SimpleNamespace(is_enabled=lambda: True, get_scale=lambda: next(scales))
    timer = StepTimer(device_kind="cpu", warmup_steps=1, measure_steps=3, clock=Clock(0.1))
    timer.attach(SimpleNamespace(accelerator=SimpleNamespace(scaler=scaler)))
    run(timer, 4)  # steps 1-2 fine, step 3 overflowed: the scale fell
    assert timer.skipped_in_window == 1


class Steps:
    """A clock whose successive marks are these step durations apart (the first call
    is the first step's start)."""

    def __init__(self, durations: list[float]) -> None:
        self.durations, self.now, self.calls = durations, 0.0, 0

    def __call__(self) -> float:
        if self.calls:
            self.now += self.durations[min(self.calls - 1, len(self.durations) - 1)]
        self.calls += 1
        return self.now


def test_a_schedule_ends_warm_up_when_steady_and_drops_a_clearly_slower_config() -> None:
    # steps 1-3 slow (a compile), then 5 s steps: steady from step 4; the incumbent steps
    # in 3 s, so the first timed steps already say this one cannot win
    schedule = Schedule(max_warmup=5, max_measure=8, incumbent_s=3.0)
    timer = StepTimer(
        device_kind="cpu", warmup_steps=5, clock=Steps([60, 9, 6, 5, 5, 5]), schedule=schedule
    )
    assert run(timer, 13) == 5
    assert timer.warmup_steps == 3 and timer.measured_step_times() == [5.0, 5.0]
    assert timer.stop_reason == "clearly slower than the best so far"
    assert timer.one_time_s() == (60 + 9 + 6) - 3 * 5  # warm-up beyond 3 steady steps


def test_the_one_time_cost_counts_the_trainers_setup_and_after_the_run_its_wall_time() -> None:
    clock = Steps([4, 60, 9, 6, 5, 5, 5])  # 4 s of setup before the first step begins
    timer = StepTimer(device_kind="cpu", warmup_steps=3, measure_steps=3, clock=clock)
    timer.train_starts()
    run(timer, 3 + 3)
    assert timer.measured_step_times() == [5.0, 5.0, 5.0]
    assert timer.one_time_s() == 4 + (60 + 9 + 6) - 3 * 5  # setup + warm-up beyond steady
    # after train() returned, 2 s later: the wall time, the run's tail included
    ended = clock.now + 2
    assert timer.one_time_s(ended) == 4 + (60 + 9 + 6) - 3 * 5 + 2


def test_a_scheduled_window_counts_a_skip_in_the_step_that_ended_warm_up() -> None:
    timer = StepTimer(
        device_kind="cpu",
        warmup_steps=3,
        clock=Steps([1.0] * 10),
        schedule=Schedule(max_warmup=3, max_measure=4),
    )
    run(timer, 7, skipped={3})  # a real skip (after good steps) in a timed step
    assert timer.warmup_steps == 1 and timer.skipped_in_window == 1


def test_only_single_process_cpu_probes_of_a_search_get_a_schedule() -> None:
    from autotune.probe._inputs import Measurement
    from autotune.probe._train import schedule_of

    plan = Measurement(warmup_steps=3, measure_steps=5, adaptive=True, incumbent_s=2.0)
    schedule = schedule_of(plan, 1)
    assert schedule is not None and schedule.incumbent_s == 2.0
    assert (schedule.max_warmup, schedule.max_measure) == (3, 5)
    assert schedule.min_window_s > 0 and schedule.longest > 5  # fast steps: timed longer
    # a GPU's timed window, a DDP probe (ranks must stop together), a confirmation run
    for other in ({"min_window_s": 2.0}, {"adaptive": False}):
        assert schedule_of(dataclasses.replace(plan, **other), 1) is None
    assert schedule_of(plan, 2) is None


def test_a_very_short_budget_times_a_warm_up_and_two_whole_steps() -> None:
    """A one-minute search's probe (2 timed steps planned) of 5 s steps on the CPU:
    one warm-up step and two timed, three steps in all, where the 3 timed steps of a
    longer budget take four; a noisy second step costs one more, never part of one."""
    from autotune.probe._inputs import Measurement
    from autotune.probe._train import schedule_of
    from autotune.tuning.time_plan import TINY_BUDGET_S, measure_steps_for

    def probe(steps: list[float], budget_s: float) -> StepTimer:
        plan = Measurement(warmup_steps=3, measure_steps=measure_steps_for(budget_s))
        schedule = schedule_of(dataclasses.replace(plan, adaptive=True), 1)
        timer = StepTimer(device_kind="cpu", warmup_steps=3, clock=Steps(steps), schedule=schedule)
        assert run(timer, 10) == timer.warmup_steps + len(timer.measured_step_times())
        return timer

    steady = [8.0, 5.0, 5.25, 5.0, 5.25, 5.0]
    minute = probe(steady, 60.0)
    assert (minute.warmup_steps, minute.measured_step_times()) == (1, [5.0, 5.25])
    assert len(probe(steady, TINY_BUDGET_S).measured_step_times()) == 3
    noisy = probe([8.0, 4.0, 5.0, 5.25, 5.0], 60.0)  # step 2 is not steady yet
    assert (noisy.warmup_steps, noisy.measured_step_times()) == (2, [5.0, 5.25])
