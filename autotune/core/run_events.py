"""What the user's run does besides training steps, read from their arguments: whether it
evaluates and saves checkpoints, and the settings of each that a rehearsal runs with
(core/rehearsal.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.core.spec import SearchSpec

# The run's fields a rehearsal runs with: its evaluation and its saving
EVALUATION_FIELDS = (
    "per_device_eval_batch_size",
    "eval_accumulation_steps",
    "prediction_loss_only",
    "eval_do_concat_batches",
    "batch_eval_metrics",
    "include_for_metrics",
)
SAVE_FIELDS = ("save_only_model", "save_safetensors")


@dataclasses.dataclass(frozen=True)
class RunEvents:
    """What the user's run does besides training, read from their arguments."""

    evaluate: bool
    save: bool
    fields: dict[str, Any]
    why_not: tuple[str, ...] = ()  # the events their run does not have, and why

    @classmethod
    def of(cls, spec: SearchSpec) -> RunEvents:
        theirs = {**spec.base_arguments, **spec.kept_arguments}
        evaluate = str(theirs.get("eval_strategy", "no")) != "no"
        save = str(theirs.get("save_strategy", "steps")) != "no"  # the Trainer saves by default
        why = (
            *(() if evaluate else ("evaluation: your run does not evaluate (eval_strategy no)",)),
            *(() if save else ("save: your run saves no checkpoints (save_strategy no)",)),
        )
        fields = {k: theirs[k] for k in (*EVALUATION_FIELDS, *SAVE_FIELDS) if k in theirs}
        return cls(evaluate, save, fields, why)

    @property
    def any(self) -> bool:
        """Whether the run does anything a rehearsal runs."""
        return self.evaluate or self.save


def required(spec: SearchSpec, rehearse: bool) -> bool:
    """Whether a config needs a rehearsal before it is exported: the run evaluates or
    saves, and the search was not told --no-rehearse."""
    return rehearse and RunEvents.of(spec).any
