"""The model built once per search (issue #15): the fork server builds it with random
weights, on the CPU, before it forks any probe; each forked probe inherits it (its pages
shared until written) instead of spending seconds building its own.

What a probe measures does not change. The weights are those a fresh probe would build
(same spec, same seed, same attention). The probe's peak still counts the model: its
pages are in the child's resident set and data segment from the fork on, as they are
in a fresh process after building it. And the baseline a probe reports is the one the
server measured after its imports and before the model, as a fresh probe measures it.
A probe whose candidate asks for another attention builds its own.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import time
from typing import Any

from autotune.core.trial import Candidate, ModelSpec
from autotune.hf.models import build_model
from autotune.probe import device

# Deferred imports: torch and transformers load in the fork server, which builds the shared
# model; the search imports this module without them


@dataclasses.dataclass(frozen=True)
class SharedModel:
    """Which model the server builds: what a probe's config must match to inherit it."""

    model: ModelSpec
    seed: int
    # what it is built with besides its config (Candidate.model_arguments)
    model_arguments: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SharedModel:
        raw = json.loads(text)
        return cls(ModelSpec(**raw["model"]), int(raw["seed"]), dict(raw["model_arguments"]))

    @classmethod
    def of(cls, model: ModelSpec, seed: int, candidate: Candidate) -> SharedModel:
        """The model a probe of `candidate` builds from `model` and `seed`."""
        return cls(model, seed, candidate.model_arguments())


_BUILT: dict[str, Any] = {}  # in the server, and in each child until it takes the model


def build(shared: SharedModel) -> float:
    """In the server, after its imports: build the model; returns the seconds it took."""

    import torch
    from transformers import set_seed

    baseline = device.baseline("cpu", 0)  # before the model, as a fresh CPU probe sees it
    started = time.perf_counter()
    threads = torch.get_num_threads()
    # One thread while building: an OpenMP pool started before fork is broken in the
    # children (a matrix product in the parent, then one in the forked child, hangs
    # here). Random init uses none today; an init that does (orthogonal: a QR) would.
    torch.set_num_threads(1)
    try:
        set_seed(shared.seed)
        model = build_model(shared.model, **shared.model_arguments)
    finally:
        torch.set_num_threads(threads)  # for the children; starts no thread here
    _BUILT.update(shared=shared, model=model, baseline=baseline)
    return time.perf_counter() - started


def take(wanted: SharedModel) -> tuple[Any, dict[str, Any]] | None:
    """In a forked probe: the inherited model and the server's baseline, when they are
    the model this probe would build (`wanted`); else None, and the inherited copy is let
    go first (its pages would count in this probe's peak beside the model it builds)."""
    model = _BUILT.pop("model", None)
    if model is None or _BUILT.get("shared") != wanted:
        del model

        gc.collect()
        return None
    return model, dict(_BUILT["baseline"])
