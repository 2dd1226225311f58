"""SearchSpec: what a study searches, fixed for the study's whole life."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from autotune.core.checkpointing import as_recorded
from autotune.core.dataset import DataSpec
from autotune.core.device import DeviceInfo
from autotune.core.enums import Task
from autotune.core.levers import BY_NAME
from autotune.core.recipe import Recipe
from autotune.core.space import SearchSpace
from autotune.core.trial import Candidate, ModelSpec


@dataclasses.dataclass(frozen=True)
class SearchSpec:
    model: ModelSpec
    device: DeviceInfo
    space: SearchSpace
    seq_len: int
    target_len: int
    memory_budget_bytes: int
    headroom: float = 0.05
    warmup_steps: int = 3
    measure_steps: int = 5
    seed: int = 0
    base_arguments: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The user's own precision, optimizer, checkpointing and batch split (--base-args):
    # the reference for parity; not part of the identity (probes replace these fields)
    recipe_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    parameters: int = 0  # counted on the meta device; 0 when unknown
    embedding_parameters: int = 0  # of those, in nn.Embedding modules
    largest_parameter: int = 0  # elements of the biggest single tensor
    # those with gradients and optimizer state: an adapter's (LoRA's ~1%); 0: all
    trainable_parameters: int = 0
    # bytes the parameters that do not train take as held (a bf16 base 2 a parameter, a
    # 4-bit one about half); 0: as the precision holds them (a stand-in built in fp32)
    frozen_bytes: int = 0
    # What the user's factory built (tuning/_user_job.job_profile): the parameters as
    # held, the quantization, what trains, the data's lengths; {} for a stand-in
    job_profile: dict[str, Any] = dataclasses.field(default_factory=dict)
    nproc_per_node: int = 1  # DDP processes per probe (torchrun); the space is per process
    nnodes: int = 1  # nodes a probe spans (core/nodes.py), nproc_per_node on each
    data: DataSpec | None = None  # the user's dataset (--dataset), tokenized once
    # The installed transformers' name for the switch (read once, where it is imported).
    checkpointing_field: str = "activation_checkpointing"
    # The user's run length (--train-steps, or max_steps in --base-args): with it,
    # selection can rank by time to finish that run (one-time costs + steps); not part
    # of the identity, so a rerun may change it
    train_steps: int = 0
    # The user's fields a probe does not run (output_dir, max_steps, logging...), which
    # the export writes back; not part of the identity
    kept_arguments: dict[str, Any] = dataclasses.field(default_factory=dict)
    # With the user's factory, which of their samples the probes train on: "" when their
    # dataset exposes its lengths (the longest ones), else why not (their own batches)
    unmeasured_lengths: str = ""
    # With the user's factory, their longest samples' indices as the survey read them, a
    # global batch's worth, longest first: every probe trains on these (not part of the
    # identity, which holds the data's lengths)
    longest_samples: tuple[int, ...] = ()
    # With packing searched (core/levers.PACKING): the length of the rows it fills, the
    # user's max_length (a packed candidate's worst case); 0 otherwise
    packed_len: int = 0

    @property
    def processes(self) -> int:
        """Every process of a probe, on every node."""
        return self.nproc_per_node * self.nnodes

    @property
    def global_batch_size(self) -> int:
        """The effective batch: per-device batch x accumulation x processes."""
        return self.space.global_batch_size * self.processes

    @property
    def own_batches(self) -> bool:
        """A user's job whose padding is searched: probes time their own batches after
        the worst case (a lever that flattens batches gains only where they have padding,
        and their longest samples have little)."""
        return bool(self.model.trainer) and any(
            BY_NAME[name].flattens_batches and len(values) > 1 for name, values in self.space.levers
        )

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len + (self.target_len if self.model.task == Task.SEQ2SEQ else 0)

    def trained_len(self, candidate: Candidate) -> int:
        """The longest row a candidate's probe trains on: a full packed row where its
        rows are packed, else the longest sample."""
        return (
            self.packed_len
            if candidate.levers.changes_samples and self.packed_len
            else self.seq_len
        )

    @property
    def sample_tokens(self) -> float:
        """The user's samples' mean length in tokens, as the survey read them (0 when
        unknown): the unit a packed step's tokens are counted in samples by."""
        lengths = self.job_profile.get("lengths", {})
        tokens, samples = lengths.get("tokens"), lengths.get("samples")
        return tokens / samples if tokens and samples else 0.0

    @property
    def fit_limit_bytes(self) -> int:
        """A config fits when its measured peak is at most this; probes run under it.

        Enforcing the budget less the headroom in the probe (not the budget itself)
        leaves the headroom spare in the user's run, in the currency the limit
        counts: on the CPU, RLIMIT_DATA counts reserved data pages, which run a few
        percent above the resident peak, and the allocator's high-water creeps up
        for tens of steps after the probe's window (benchmarks/fidelity.py).
        """
        return int(self.memory_budget_bytes * (1.0 - self.headroom))

    @property
    def recipe(self) -> Recipe:
        """The user's recipe, typed (`recipe_settings` is what the study stores)."""
        return Recipe(self.recipe_settings)

    def identity(self) -> dict[str, Any]:
        """What must match for a stored study to be resumed by this search."""
        config_hash = hashlib.sha256(
            json.dumps(self.model.config, sort_keys=True).encode()
        ).hexdigest()[:16]
        return {
            "model": self.model.name,
            "model_config_sha256": config_hash,
            "task": self.model.task,
            "device": f"{self.device.kind} {self.device.name}",
            "space": _space_identity(self.space),
            "seq_len": self.seq_len,
            "target_len": self.target_len,
            "memory_budget_bytes": self.memory_budget_bytes,
            "headroom": self.headroom,
            "warmup_steps": self.warmup_steps,
            "measure_steps": self.measure_steps,
            "base_arguments": self.base_arguments,
            "nproc_per_node": self.nproc_per_node if self.nproc_per_node > 1 else 0,
            "nnodes": self.nnodes if self.nnodes > 1 else 0,
            "data": f"{self.data.source} {self.data.fingerprint}" if self.data else "",
        } | self._job_identity()

    def _job_identity(self) -> dict[str, Any]:
        """A LoRA stand-in's adapter, a user's factory, its arguments class and what it
        built: named only when there is one, so a study of a plain --model still resumes."""
        job: dict[str, Any] = {"adapter": self.model.adapter, "trainer": self.model.trainer}
        job["args_class"] = self.model.args_class
        job["job"] = self.job_profile
        job["packed_len"] = self.packed_len
        return {k: v for k, v in job.items() if v}

    def measurement_identity(self) -> dict[str, Any]:
        """What must match for a probe another study measured to stand for one of this
        study's (besides the config itself and the library versions): the model, the
        device, the lengths, the recipe's other fields, the processes, the data, and the
        probe's window."""
        keys = (
            "model",
            "model_config_sha256",
            "task",
            "device",
            "seq_len",
            "target_len",
            "base_arguments",
            "nproc_per_node",
            "nnodes",
            "data",
            "warmup_steps",
            "measure_steps",
        )
        identity = self.identity()
        return {k: v for k, v in identity.items() if k in keys} | self._job_identity()

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SearchSpec:
        raw = json.loads(text)
        raw["model"] = ModelSpec(**raw["model"])
        device = raw["device"]
        if device.get("capability") is not None:
            device["capability"] = tuple(device["capability"])
        raw["device"] = DeviceInfo(**device)
        space = {k: tuple(v) if isinstance(v, list) else v for k, v in raw["space"].items()}
        for key in ("levers", "not_offered"):  # pairs, as JSON lists
            space[key] = tuple(
                (n, tuple(v) if isinstance(v, list) else v) for n, v in space.get(key, ())
            )
        raw["space"] = SearchSpace(**space)  # type: ignore[arg-type]
        if raw.get("data"):
            raw["data"] = DataSpec.from_dict(raw["data"])
        raw["longest_samples"] = tuple(raw.get("longest_samples", ()))
        return cls(**raw)

    def describe(self) -> str:
        kind = "tokens" if self.model.task != Task.SEQ2SEQ else "source/target tokens"
        lengths = (
            f"{self.seq_len}/{self.target_len}" if self.model.task == Task.SEQ2SEQ else self.seq_len
        )
        what = f"{self.model.name} ({self.model.task})"
        if self.model.trainer:  # the user's job: their factory, and what trains in it
            location, _, function = self.model.trainer.rpartition(":")
            where = "your session's" if location.endswith(".pkl") else location.rsplit("/", 1)[-1]
            what = f"{where}:{function} training {what}"
        if self.model.adapter:
            what += f" with a LoRA adapter (r={self.model.adapter.get('r', 8)})"
        if self.trainable_parameters:
            what += (
                f", {self.trainable_parameters / 1e6:.2f}M of {self.parameters / 1e6:.1f}M "
                "parameters trained"
            )
        return (
            f"{what} on {self.device.kind} {self.device.name}; "
            f"budget {self.memory_budget_bytes / 2**30:.1f} GiB"
            + (" per process" if self.processes > 1 else "")
            + f"; global batch {self.global_batch_size}"
            + (f" over {self.processes} processes" if self.processes > 1 else "")
            + (f" on {self.nnodes} nodes" if self.nnodes > 1 else "")
            + f"; {lengths} {kind}"
        )


def _space_identity(space: SearchSpace) -> dict[str, Any]:
    """The space as a study records it; the default sampling is left out, so a study
    made before the sampling was a dimension still resumes."""
    raw = dataclasses.asdict(space)
    if tuple(raw["samplings"]) == ("random",):
        del raw["samplings"]
    if not raw["levers"]:  # a study made before the levers were searched still resumes
        del raw["levers"]
    del raw["not_offered"]  # why a lever is not searched is not what is searched
    raw["checkpointing"] = [as_recorded(c, space.checkpointing) for c in space.checkpointing]
    return raw
