"""The step timer's rules, driven step by step with a fake clock and a fake scaler."""

from __future__ import annotations

from types import SimpleNamespace

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
    timer = StepTimer(device_kind="cpu", warmup_steps=2, measure_steps=5, min_window_s=2.0,
                      clock=Clock(0.0625))  # fmt: skip
    ran = run(timer, 500)
    assert ran - 2 == 32
    assert len(timer.measured_step_times()) == 32
    # Slow steps: time is there at once, the step floor holds the window open.
    slow = StepTimer(device_kind="cpu", warmup_steps=1, measure_steps=5, min_window_s=2.0,
                     clock=Clock(1.0))  # fmt: skip
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
