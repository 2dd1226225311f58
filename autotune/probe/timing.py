"""Honest step timing as a Trainer callback (DESIGN.md, invariant 6).

A step is a whole optimizer step: all accumulation micro-steps plus the optimizer
update. The device is synchronised at each step's end, so the interval between two
step ends is the real time of one step. Warm-up steps are not kept.
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback

from autotune.probe import device as hardware


class StepTimer(TrainerCallback):
    def __init__(self, *, device_kind: str, warmup_steps: int) -> None:
        self.device_kind = device_kind
        self.warmup_steps = warmup_steps
        self.step_ends: list[float] = []
        self.first_begin: float | None = None
        self.skipped_in_window = 0
        self.skipped_in_warmup = 0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.first_begin is None:
            hardware.synchronize(self.device_kind)
            self.first_begin = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        hardware.synchronize(self.device_kind)
        self.step_ends.append(time.perf_counter())
        # accelerate's optimizer wrapper reports a step the fp16 loss scaler skipped.
        if getattr(kwargs.get("optimizer"), "step_was_skipped", False):
            if len(self.step_ends) > self.warmup_steps:
                self.skipped_in_window += 1
            else:
                self.skipped_in_warmup += 1

    def measured_step_times(self) -> list[float]:
        """Durations of the steps after warm-up (each from the previous step's end)."""
        ends = self.step_ends
        return [ends[i] - ends[i - 1] for i in range(max(1, self.warmup_steps), len(ends))]
