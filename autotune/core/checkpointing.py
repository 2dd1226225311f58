"""Activation checkpointing, graded: the searched dimension declared in one place.

transformers 5.24 checkpoints every N-th layer (`activation_checkpointing_kwargs=
{"every_n_layers": N}`: layer i is checkpointed when i % N == 0, counting each
`GradientCheckpointingLayer` of the model in order, an encoder's before its decoder's)
and can hold the inputs it saves in pinned host memory (`"offload": True`). The levels,
ordered by the memory they free: off, every 4th layer, every 2nd, every layer, every
layer offloaded. Memory is monotone along that order, all else the same (tuning/_skips.py
rules by it), and none changes the training's arithmetic: the recomputed forward is the
same forward.

Everything autotune knows of the dimension is here: the levels and what users write
(`--checkpointing off,every-4,...`), which levels a model and device are offered and why
not, the TrainingArguments fields a level sets and the level a user's fields name, the
share of layers whose activations are kept for the estimate, and the label `describe`
and `show` print.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from autotune.core.enums import DeviceKind


class Checkpointing(enum.StrEnum):
    """A level of activation checkpointing, in the order of the memory it frees."""

    OFF = "off"
    EVERY_4 = "every-4"  # every 4th layer checkpointed, the others keep their activations
    EVERY_2 = "every-2"
    ON = "on"  # every layer: the classic all-or-nothing
    OFFLOAD = "offload"  # every layer, the saved inputs in pinned host memory (CUDA)

    def __bool__(self) -> bool:
        """Checkpointing is on, at any level."""
        return self is not Checkpointing.OFF

    @classmethod
    def of(cls, value: object) -> Checkpointing:
        """A level from what studies, configs and users hold: a level's name, or a bool
        (True: every layer), as studies recorded before checkpointing was graded."""
        if isinstance(value, bool):
            return cls.ON if value else cls.OFF
        return cls(str(value))

    @property
    def every_n_layers(self) -> int:
        return {Checkpointing.EVERY_4: 4, Checkpointing.EVERY_2: 2}.get(self, 1)

    @property
    def recomputed(self) -> float:
        """The share of the layers whose forward the backward runs again: none off, every
        nth layer's, every layer's (offload too)."""
        return 1.0 / self.every_n_layers if self else 0.0

    @property
    def rank(self) -> int:
        """Its place in the order of memory freed: a higher rank holds no more memory."""
        return list(Checkpointing).index(self)

    @property
    def label(self) -> str:
        """How `describe` names it: no-ckpt, ckpt, ckpt/4, ckpt/2, ckpt+offload."""
        if not self:
            return "no-ckpt"
        if self == Checkpointing.OFFLOAD:
            return "ckpt+offload"
        n = self.every_n_layers
        return "ckpt" if n == 1 else f"ckpt/{n}"

    def arguments(self, field: str, user_kwargs: object = None) -> dict[str, Any]:
        """The TrainingArguments fields the level sets (`field`: the installed
        transformers' name for checkpointing; its kwargs are `{field}_kwargs`, those of
        activation_checkpointing_enable()). The user's own kwargs (use_reentrant, ...)
        are kept; the level's replace theirs of every_n_layers and offload."""
        theirs = _mapping(user_kwargs)
        kwargs = {k: v for k, v in theirs.items() if k not in ("every_n_layers", "offload")}
        if self.every_n_layers > 1:
            kwargs["every_n_layers"] = self.every_n_layers
        if self == Checkpointing.OFFLOAD:
            kwargs["offload"] = True
        fields: dict[str, Any] = {field: bool(self)}
        if bool(self) and kwargs:
            fields[f"{field}_kwargs"] = kwargs
        return fields

    @classmethod
    def from_arguments(cls, settings: Mapping[str, Any], field: str) -> Checkpointing:
        """The level a user's TrainingArguments fields name (off when they set none)."""
        if not settings.get(field):
            return cls.OFF
        kwargs = _mapping(settings.get(f"{field}_kwargs"))
        if kwargs.get("offload"):
            return cls.OFFLOAD
        return {4: cls.EVERY_4, 2: cls.EVERY_2}.get(int(kwargs.get("every_n_layers", 1)), cls.ON)

    def kept_layers(self, first: int, count: int) -> int:
        """Of the `count` layers from index `first`, how many keep all their activations
        (are not checkpointed)."""
        if not self:
            return count
        n = self.every_n_layers
        checkpointed = sum(1 for i in range(first, first + count) if i % n == 0)
        return count - checkpointed


HELP = (
    "Activation (gradient) checkpointing levels to try, by the memory they free: off, "
    "every-4 (every 4th layer), every-2, on (every layer), offload (every layer, the saved "
    "inputs in pinned host memory: CUDA) [default: every level the model and device offer]."
)


def as_recorded(level: Checkpointing, levels: Collection[Checkpointing]) -> bool | str:
    """A level as studies store it (identity, trial params, claim keys): a bool among
    off and on alone, as every study held checkpointing before it was graded (so those
    studies still resume: Optuna refuses a param whose choices change), else its name."""
    return bool(level) if set(levels) <= {Checkpointing.OFF, Checkpointing.ON} else str(level)


def _mapping(kwargs: object) -> dict[str, Any]:
    """The kwargs a user set, as a dict: TrainingArguments takes a dict or its JSON."""
    if isinstance(kwargs, str):
        try:
            kwargs = json.loads(kwargs)
        except ValueError:
            return {}
    return dict(kwargs) if isinstance(kwargs, Mapping) else {}


def parse(texts: Sequence[str]) -> tuple[Checkpointing, ...]:
    """`--checkpointing` values as levels; ValueError naming the levels on anything else."""
    try:
        return tuple(dict.fromkeys(Checkpointing(t.strip().lower()) for t in texts))
    except ValueError:
        names = ", ".join(level.value for level in Checkpointing)
        raise ValueError(f"--checkpointing {','.join(texts)}: choose from {names}") from None


# A factory that turns checkpointing on itself (prepare_model_for_kbit_training): the
# Trainer never turns it off, but re-grades it (every N layers, offload)
FORCED = (
    "your factory turns it on itself (prepare_model_for_kbit_training does) and the "
    "Trainer never turns it off: every probe runs checkpointed, at the level searched"
)
FORCED_OFF = (
    "--checkpointing off: your factory turns activation checkpointing on itself "
    "(prepare_model_for_kbit_training does), so no probe could run without it; "
    "drop --checkpointing, or pass use_gradient_checkpointing=False there"
)


def offered(
    layers: int | None, device_kind: DeviceKind, *, forced: bool = False
) -> tuple[tuple[Checkpointing, ...], tuple[tuple[str, str], ...]]:
    """(the levels this model, device and job are offered, [(level, why not)]).

    `layers`: the layers `every_n_layers` counts (the model's GradientCheckpointingLayer
    modules; 0 where its layers predate them); None where the installed transformers
    checkpoints every layer or none. A level is offered where it checkpoints fewer layers
    than the next one up. `forced`: the user's job turns checkpointing on itself, so
    every level is offered but off."""
    levels, why = _by_depth(layers, device_kind)
    if forced:
        return tuple(level for level in levels if level), (
            (f"checkpointing {Checkpointing.OFF}", FORCED),
            *why,
        )
    return levels, why


def narrowed(
    levels: tuple[Checkpointing, ...],
    why: tuple[tuple[str, str], ...],
    asked: Sequence[str] | None,
    *,
    forced: bool = False,
) -> tuple[Checkpointing, ...]:
    """The levels offered narrowed to those `--checkpointing` asks for; ValueError, in
    one line, for a level not offered (with why) or not known. Off asked with others is
    dropped where the job forces checkpointing on (the not-offered list says why)."""
    if not asked:
        return levels
    wanted = parse(asked)
    if forced and not any(wanted):
        raise ValueError(FORCED_OFF)
    wanted = tuple(level for level in wanted if level or not forced)
    missing = [level for level in wanted if level not in levels]
    if missing:
        said = dict(why).get(f"checkpointing {missing[0]}", "not offered here")
        raise ValueError(f"--checkpointing {missing[0]}: {said}; offered: {', '.join(levels)}")
    return wanted


def _by_depth(
    layers: int | None, device_kind: DeviceKind
) -> tuple[tuple[Checkpointing, ...], tuple[tuple[str, str], ...]]:
    """The levels a model's depth tells apart, and the device allows."""
    if layers is None:
        old = "the installed transformers checkpoints every layer or none (5.24 grades it)"
        graded = (Checkpointing.EVERY_4, Checkpointing.EVERY_2, Checkpointing.OFFLOAD)
        return (Checkpointing.OFF, Checkpointing.ON), tuple(
            (f"checkpointing {g}", old) for g in graded
        )
    levels = [Checkpointing.OFF]
    why: list[tuple[str, str]] = []
    counts = {Checkpointing.ON: layers}
    for level in (Checkpointing.EVERY_2, Checkpointing.EVERY_4):
        counts[level] = layers - level.kept_layers(0, layers)
    if counts[Checkpointing.EVERY_4] < counts[Checkpointing.EVERY_2]:
        levels.append(Checkpointing.EVERY_4)
    else:
        why.append((f"checkpointing {Checkpointing.EVERY_4}", _same(layers, "every 2nd")))
    if counts[Checkpointing.EVERY_2] < layers:
        levels.append(Checkpointing.EVERY_2)
    else:
        why.append((f"checkpointing {Checkpointing.EVERY_2}", _same(layers, "every layer")))
    levels.append(Checkpointing.ON)
    if device_kind == DeviceKind.CUDA:
        levels.append(Checkpointing.OFFLOAD)
    else:
        why.append(
            (
                f"checkpointing {Checkpointing.OFFLOAD}",
                "offload moves the saved activations from the GPU to host memory; on the "
                "CPU they are in host memory already",
            )
        )
    return tuple(levels), tuple(why)


def _same(layers: int, other: str) -> str:
    if not layers:
        return (
            "the model's layers cannot be checkpointed one in N (they predate "
            "transformers' GradientCheckpointingLayer)"
        )
    plural = "s" if layers > 1 else ""
    return f"the model has {layers} layer{plural}: it would checkpoint as many as {other}"
