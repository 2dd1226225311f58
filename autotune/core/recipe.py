"""The user's recipe as one typed value: the tuned fields of their arguments as their
class builds them (its defaults included), their file's values over those. The plan
builds it once (`SearchSpec.recipe`); selection, parity, the plan's guesses and the
export read it, never a field's default written out again."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.core.checkpointing import Checkpointing
from autotune.core.enums import Precision
from autotune.core.optimizers import PLAIN
from autotune.core.precisions import from_fields


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What the user's own run trains with (`settings`: their tuned fields, by name)."""

    settings: Mapping[str, Any]

    @property
    def given(self) -> bool:
        """Whether the user gave one (an arguments file, or their factory's arguments):
        without, the headline compares with the plain default."""
        return bool(self.settings)

    @property
    def optim(self) -> str:
        """Their optimizer. A study planned before the class's default was read into
        the recipe has none where their file was silent: the plain AdamW it assumed."""
        return str(self.settings.get("optim") or PLAIN)

    @property
    def precision(self) -> Precision:
        """The precision their flags run (fp32 where they set none)."""
        return from_fields(self.settings)

    @property
    def micro_batch(self) -> int | None:
        """Their per-device batch, where they set one."""
        batch = self.settings.get("per_device_train_batch_size")
        return batch if isinstance(batch, int) and not isinstance(batch, bool) else None

    @property
    def tf32(self) -> bool:
        """Whether they turned TF32 matmuls on (kept where autotune does not search it)."""
        return self.settings.get("tf32") is True

    @property
    def sampling(self) -> str:
        """How their Trainer orders the samples."""
        return str(self.settings.get("train_sampling_strategy", "random"))

    def checkpointing(self, field: str) -> Checkpointing:
        """The checkpointing level their fields name, under transformers' `field`."""
        return Checkpointing.from_arguments(self.settings, field)

    def checkpointing_kwargs(self, field: str) -> Any:
        """Their checkpointing's keyword arguments, as they wrote them."""
        return self.settings.get(f"{field}_kwargs")
