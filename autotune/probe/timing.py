"""Honest step timing as a Trainer callback (docs/ARCHITECTURE.md, invariant 6).

A step is a whole optimizer step: all accumulation micro-steps plus the optimizer
update. Warm-up steps are not kept. On the CPU each step's end is a timestamp; on CUDA
it is a recorded event (no host sync per step), and the events are read after the
window, once. On fast devices the window is also a time: it closes once it has at least
`measure_steps` steps and lasts `min_window_s` (and has MIN_FAST_STEPS steps), so a 20 ms
step is not timed over a tenth of a second.

fp16 steps the loss scaler skipped are seen from the scale itself (a skipped step halves
it), which also covers fused AdamW, which takes the scale and skips inside its own step.
The initial scale's calibration (a run of skips from the first step) is not instability.

With a Schedule (the CPU's search probes), warm-up ends when step time is steady and the
window closes as soon as the candidate can be ranked against the best so far
(core/schedule.py); step ends are host timestamps there, so reading them costs nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from autotune.core.schedule import Schedule
from autotune.probe import device

MIN_FAST_STEPS = 20  # with a time window: at least this many measured steps


class StepTimer(TrainerCallback):
    def __init__(
        self,
        *,
        device_kind: str,
        warmup_steps: int,
        measure_steps: int = 0,
        min_window_s: float = 0.0,
        clock: Callable[[], float] | None = None,
        schedule: Schedule | None = None,
    ) -> None:
        self.schedule = schedule
        # with a schedule, known once step time is steady (None until then)
        self.warmup: int | None = None if schedule else warmup_steps
        self.stop_reason = ""  # why a scheduled window closed
        self.measure_steps = measure_steps
        self.min_window_s = min_window_s
        self.marks = device.StepMarks(device_kind, clock=clock)
        self.scale: Callable[[], float | None] = lambda: None
        self.last_scale: float | None = None
        self.calibrating = True  # the initial run of skipped steps
        self.skipped: list[int] = []  # steps (1-based) the loss scaler skipped, after calibration
        self.calibration_steps = 0
        self.train_called: float | None = None  # host time trainer.train() was called

    def train_starts(self) -> None:
        """Call just before trainer.train(): its setup counts in the one-time cost."""
        self.train_called = self.marks.clock()

    def attach(self, trainer: Any) -> None:
        """Read the loss scale from the trainer's accelerator (fp16 only)."""
        scaler = getattr(getattr(trainer, "accelerator", None), "scaler", None)
        if scaler is not None and scaler.is_enabled():
            self.scale = lambda: float(scaler.get_scale())
            self.last_scale = self.scale()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.marks.started:
            self.marks.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.mark()
        self._count_skip(self._skipped(kwargs.get("optimizer")))
        if self._window_done() or self._scheduled_stop():
            control.should_training_stop = True

    @property
    def warmup_steps(self) -> int:
        """Warm-up steps (with a schedule: so far, until step time is steady)."""
        return self.warmup if self.warmup is not None else len(self.marks.ends)

    def _scheduled_stop(self) -> bool:
        if self.schedule is None:
            return False
        if self.warmup is None:
            self.warmup = self.schedule.warmup_steps(
                self.marks.durations(),
                calibration_steps=self.calibration_steps,
                calibrating=self.calibrating,
            )
        measured = self.measured_step_times()
        if self.warmup is None or not measured:
            return False
        self.stop_reason = self.schedule.stop_reason(measured, self.one_time_s())
        return bool(self.stop_reason)

    def one_time_s(self, ended: float | None = None) -> float:
        """What the run pays once: the trainer's setup before the first step (from
        `train_starts`) and the warm-up's time beyond steady steps (a cold compilation,
        slow first steps). The one definition: the early stop ranks by it while the run
        goes on (host marks, the CPU's); after trainer.train() returned at host time
        `ended`, the wall time less the timed and steady warm-up steps (exact on CUDA
        too, where a step's host mark may run ahead of the device)."""
        measured = self.measured_step_times()
        if not measured or self.warmup is None:
            return 0.0
        steady = self.warmup * statistics.median(measured)
        if ended is not None and self.train_called is not None:
            return max(0.0, ended - self.train_called - sum(measured) - steady)
        setup = self.marks.began - self.train_called if self.train_called is not None else 0.0
        return max(0.0, setup + self.marks.host_elapsed(self.warmup) - steady)

    def _skipped(self, optimizer: Any) -> bool:
        # accelerate's optimizer wrapper reports a skip (not for fused AdamW); a fall of
        # the loss scale reports it for every optimizer.
        skipped = bool(getattr(optimizer, "step_was_skipped", False))
        scale = self.scale()
        if scale is not None and self.last_scale is not None and scale < self.last_scale:
            skipped = True
        self.last_scale = scale if scale is not None else self.last_scale
        return skipped

    def _count_skip(self, skipped: bool) -> None:
        if not skipped:
            self.calibrating = False
        elif self.calibrating:
            self.calibration_steps += 1
        else:
            self.skipped.append(len(self.marks.ends))

    @property
    def skipped_in_window(self) -> int:
        return sum(step > self.warmup_steps for step in self.skipped)

    @property
    def skipped_in_warmup(self) -> int:
        return len(self.skipped) - self.skipped_in_window

    def _window_done(self) -> bool:
        """With a time window: enough measured steps and enough measured time."""
        if self.min_window_s <= 0:
            return False
        measured = len(self.marks.ends) - self.warmup_steps
        if measured < max(self.measure_steps, MIN_FAST_STEPS):
            return False
        return self.marks.host_elapsed_since(self.warmup_steps) >= self.min_window_s

    def measured_step_times(self) -> list[float]:
        """Durations of the steps after warm-up (each from the previous step's end)."""
        if self.warmup is None:
            return []
        durations = self.marks.durations()
        return durations[max(1, self.warmup) - 1 :] if self.warmup else durations
