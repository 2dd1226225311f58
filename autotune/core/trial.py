"""The typed values that cross module borders for one trial: what to run, and what happened.

Each is a frozen dataclass that round-trips through JSON, so the parent and the child
(`python -m autotune.probe config.json`) share nothing but files.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from pathlib import Path
from typing import Any


class Outcome(str, enum.Enum):
    """The closed set of trial outcomes (DESIGN.md, invariant 3)."""

    OK = "ok"
    OOM = "oom"
    UNSTABLE = "unstable"
    TIMEOUT = "timeout"
    ERROR = "error"
    SKIPPED = "skipped"


PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def checkpointing_field() -> str:
    """`activation_checkpointing` in current transformers; `gradient_checkpointing` before."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else ("gradient_checkpointing")
    )


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One point of the search space: the training settings that change speed and memory."""

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    precision: str
    activation_checkpointing: bool
    optim: str
    # TrainingArguments.train_sampling_strategy; searched only when --dataset is given
    train_sampling_strategy: str = "random"

    @property
    def family(self) -> tuple[str, bool, str]:
        """Settings other than the batch: memory is monotone in batch within a family.

        The sampling is left out: probes measure memory on worst-case batches, the same
        whatever the order of the real ones."""
        return (self.precision, self.activation_checkpointing, self.optim)

    def training_arguments(self, *, device_kind: str) -> dict[str, Any]:
        """The TrainingArguments fields this candidate sets (what export writes)."""
        args: dict[str, Any] = {
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "fp16": self.precision == "fp16",
            "bf16": self.precision == "bf16",
            checkpointing_field(): self.activation_checkpointing,
            "optim": self.optim,
        }
        if self.train_sampling_strategy != "random":
            args["train_sampling_strategy"] = self.train_sampling_strategy
        if device_kind == "cuda":
            # Explicit either way, so "fp32" means full fp32 matmuls whatever torch's default.
            args["tf32"] = self.precision == "tf32"
        else:
            args["use_cpu"] = True
        return args

    def describe(self) -> str:
        ckpt = "ckpt" if self.activation_checkpointing else "no-ckpt"
        return (
            f"batch {self.per_device_train_batch_size}x{self.gradient_accumulation_steps} "
            f"{self.precision} {ckpt} {self.optim}"
            + (" grouped" if self.train_sampling_strategy == "group_by_length" else "")
        )


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model resolved to its architecture: enough to build it with random weights."""

    name: str
    source: str  # "local", "hub", "cache" or "preset"
    task: str  # "seq2seq", "causal-lm", "masked-lm", "classification"
    config: dict[str, Any]

    @property
    def vocab_size(self) -> int:
        return int(self.config.get("vocab_size", 32000))


@dataclasses.dataclass(frozen=True)
class TrialConfig:
    """Everything the child needs; the child is a pure function of this value."""

    number: int
    trial_dir: str
    model: ModelSpec
    candidate: Candidate
    device: str  # "cpu", "cuda:0"
    seq_len: int
    target_len: int
    memory_budget_bytes: int | None
    warmup_steps: int = 3
    measure_steps: int = 5
    seed: int = 0
    base_arguments: dict[str, Any] = dataclasses.field(default_factory=dict)
    concurrent: int = 1  # probes sharing the machine's cores while this one runs
    data_path: str = ""  # the user's tokenized data: real batches are timed after the worst case
    pad_token_id: int = 0
    nproc_per_node: int = 1  # >1: a DDP run of this many processes, launched by torchrun

    @property
    def device_kind(self) -> str:
        return self.device.split(":")[0]

    @property
    def global_batch_size(self) -> int:
        c = self.candidate
        return c.per_device_train_batch_size * c.gradient_accumulation_steps * self.nproc_per_node

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len + (self.target_len if self.model.task == "seq2seq" else 0)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrialConfig:
        raw = json.loads(text)
        raw["model"] = ModelSpec(**raw["model"])
        raw["candidate"] = Candidate(**raw["candidate"])
        return cls(**raw)


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """What a trial measured. Figures are None when the trial did not get that far."""

    outcome: Outcome
    reason: str = ""
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    step_time_median_s: float | None = None
    step_time_spread: float | None = None  # interquartile range / median of step times
    step_times_s: tuple[float, ...] = ()
    peak_memory_bytes: int | None = None
    final_loss: float | None = None
    loss_finite: bool | None = None
    skipped_steps: int = 0
    model_flops_per_s: float | None = None  # achieved: FLOPs per sample x samples/s
    peak_flops_per_s: float | None = None  # a matrix multiply at this precision, same device
    phases_s: dict[str, float] = dataclasses.field(default_factory=dict)
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    error: str = ""
    concurrent: int = 1  # probes that shared the machine's cores with this one
    # With --dataset, samples/s, tokens/s (real, non-pad) and step times are those of
    # real batches; the worst case's samples/s is kept here.
    worst_case_samples_per_s: float | None = None
    padding_fraction: float | None = None  # pad share of the tokens in the timed real batches

    def to_json(self) -> str:
        raw = dataclasses.asdict(self)
        raw["outcome"] = self.outcome.value
        return json.dumps(raw, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrialResult:
        """Parse a result; raises ValueError (or TypeError/KeyError) on anything malformed."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("result is not a JSON object")
        raw["outcome"] = Outcome(raw["outcome"])
        raw["step_times_s"] = tuple(float(t) for t in raw.get("step_times_s", ()))
        return cls(**raw)

    @property
    def mfu(self) -> float | None:
        """Model FLOP utilisation: achieved model FLOP/s over the measured peak."""
        if not self.model_flops_per_s or not self.peak_flops_per_s:
            return None
        return self.model_flops_per_s / self.peak_flops_per_s

    def replace(self, **changes: Any) -> TrialResult:
        return dataclasses.replace(self, **changes)


def write_atomic(path: Path, text: str) -> None:
    """Write a file so that readers see the old content or the new, never half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
