"""A candidate as Optuna trial params, and back.

Params are named after the TrainingArguments fields they set; `precision` stands for
the fp16/bf16/tf32 flags. The sampling and the levers are params only where the space
varies them.
"""

from __future__ import annotations

from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution

from autotune.core.checkpointing import Checkpointing, as_recorded
from autotune.core.space import SearchSpace
from autotune.core.trial import Candidate


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    found: dict[str, BaseDistribution] = {
        "per_device_train_batch_size": CategoricalDistribution(list(space.all_batches)),
        "precision": CategoricalDistribution([str(p) for p in space.precisions]),
        "activation_checkpointing": CategoricalDistribution(
            [_checkpointing(c, space) for c in space.checkpointing]
        ),
        "optim": CategoricalDistribution(list(space.optimizers)),
    }
    if len(space.samplings) > 1:  # a dimension only when the user's data is given
        found["train_sampling_strategy"] = CategoricalDistribution(list(space.samplings))
    for name, values in space.varied_levers.items():  # each where the space varies it
        found[name] = CategoricalDistribution(list(values))
    return found


def candidate_params(candidate: Candidate, space: SearchSpace | None = None) -> dict[str, Any]:
    """The trial params of a candidate (the sampling only where the space varies it)."""
    params: dict[str, Any] = {
        "per_device_train_batch_size": candidate.per_device_train_batch_size,
        "precision": str(candidate.precision),
        "activation_checkpointing": _checkpointing(candidate.activation_checkpointing, space),
        "optim": candidate.optim,
    }
    if space is not None and len(space.samplings) > 1:
        params["train_sampling_strategy"] = candidate.train_sampling_strategy
    for name in space.varied_levers if space is not None else ():
        params[name] = getattr(candidate, name)
    return params


def _checkpointing(level: Checkpointing, space: SearchSpace | None) -> bool | str:
    return as_recorded(level, space.checkpointing if space is not None else (level,))


def has_candidate(params: dict[str, Any]) -> bool:
    """Whether a trial's params hold a whole config. A trial another worker is asking
    for is running before its params are in, and SQLite reads a trial's params and its
    attributes in separate statements: a search once read a claimed trial with no params
    and failed on it (two searches on one study file)."""
    return all(
        name in params
        for name in (
            "per_device_train_batch_size",
            "precision",
            "activation_checkpointing",
            "optim",
        )
    )


def candidate_of(space: SearchSpace, params: dict[str, Any]) -> Candidate:
    levers = {name: params[name] for name in space.varied_levers if name in params}
    return space.candidate(
        int(params["per_device_train_batch_size"]),
        str(params["precision"]),
        Checkpointing.of(params["activation_checkpointing"]),
        str(params["optim"]),
        str(params.get("train_sampling_strategy", "random")),
        **levers,
    )
