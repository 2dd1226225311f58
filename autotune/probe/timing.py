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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

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
    ) -> None:
        self.warmup_steps = warmup_steps
        self.measure_steps = measure_steps
        self.min_window_s = min_window_s
        self.marks = device.StepMarks(device_kind, clock=clock)
        self.scale: Callable[[], float | None] = lambda: None
        self.last_scale: float | None = None
        self.calibrating = True  # the initial run of skipped steps
        self.skipped_in_window = 0
        self.skipped_in_warmup = 0
        self.calibration_steps = 0

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
        if self._window_done():
            control.should_training_stop = True

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
            return
        if self.calibrating:
            self.calibration_steps += 1
        elif len(self.marks.ends) > self.warmup_steps:
            self.skipped_in_window += 1
        else:
            self.skipped_in_warmup += 1

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
        durations = self.marks.durations()
        return durations[max(1, self.warmup_steps) - 1 :] if self.warmup_steps else durations
