"""The typed values that cross module borders for one trial: what to run, and what happened.

Each is a frozen dataclass that round-trips through JSON, so the parent and the child
(`python -m autotune.probe config.json`) share nothing but files.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from autotune.core._typed import check_fields
from autotune.core.checkpointing import Checkpointing
from autotune.core.enums import DeviceKind, Outcome, Precision, Task
from autotune.core.files import parse_json
from autotune.core.levers import DECLARED, SetLevers, model_arguments
from autotune.core.parity_verdict import Parity
from autotune.core.rehearsal import Rehearsal


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One point of the search space: the training settings that change speed and memory."""

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    precision: Precision
    activation_checkpointing: Checkpointing  # graded: core/checkpointing.py
    optim: str
    # TrainingArguments.train_sampling_strategy; searched only when --dataset is given
    train_sampling_strategy: str = "random"
    # The levers beyond the classic five, declared in core/levers.py (this order), each
    # searched only where the device, the installed packages and the model allow it;
    # the defaults are a plain run.
    torch_compile: bool = False
    attn_implementation: str = ""
    use_liger_kernel: bool = False
    padding_free: bool = False
    packing: bool = False
    dataloader_num_workers: int = 0
    zero_stage: int = 0
    fsdp_mode: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", Precision(self.precision))
        level = Checkpointing.of(self.activation_checkpointing)
        object.__setattr__(self, "activation_checkpointing", level)

    @property
    def family(self) -> tuple[object, ...]:
        """Every setting but the batch split: memory is monotone in batch within a family.

        Derived from the fields, so a new dimension or lever is part of the family
        unless it is named in OUTSIDE_FAMILY."""
        return tuple(
            getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name not in OUTSIDE_FAMILY
        )

    def lever_values(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in LEVERS}

    def model_arguments(self) -> dict[str, Any]:
        """What the model is built with besides its config (the attention kernel)."""
        return model_arguments(self.lever_values())

    @property
    def levers(self) -> SetLevers:
        """The levers away from their plain values (core/levers.py), with their values,
        and what they do: the rest of autotune asks this, never for a lever by name."""
        return SetLevers.of(self.lever_values())

    def keeping_samples(self) -> Candidate:
        """The same config, its steps training the recipe's samples (no rows packed)."""
        plain = {lever.name: lever.plain for lever, _ in self.levers if lever.changes_samples}
        return dataclasses.replace(self, **plain)

    @property
    def flash_attention(self) -> bool:
        """Its attention kernel is a flash kernel (packed rows pass their boundaries)."""
        return self.attn_implementation.startswith("flash")

    def describe(self) -> str:
        ckpt = self.activation_checkpointing.label
        return (
            f"batch {self.per_device_train_batch_size}x{self.gradient_accumulation_steps} "
            f"{self.precision} {ckpt} {self.optim}"
            + (" grouped" if self.train_sampling_strategy == "group_by_length" else "")
            + "".join(f" {lever.label(value)}" for lever, value in self.levers)
        )


# Candidate fields that are not part of a family: the batch split itself, and what
# leaves a probe's memory alone (probes measure memory on worst-case batches, the same
# whatever the order of the real ones; the levers declare their own: core/levers.py)
OUTSIDE_FAMILY = frozenset(
    {"per_device_train_batch_size", "gradient_accumulation_steps", "train_sampling_strategy"}
    | {lever.name for lever in DECLARED if not lever.in_family}
)

# Candidate fields searched beyond batch, precision, checkpointing, optimizer, sampling,
# in the order core/levers.py declares them
LEVERS = tuple(lever.name for lever in DECLARED)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model resolved to its architecture: enough to build it with random weights."""

    name: str
    source: str  # "local", "hub", "cache", "preset", or "factory" (the user's own job)
    task: Task
    config: dict[str, Any]
    # A PEFT adapter's settings: the LoRA --lora wraps the stand-in in, or what the
    # user's factory built ({}: every parameter trains)
    adapter: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The user's Trainer factory ("/abs/train.py:make_trainer", "pkg.mod:make_trainer")
    # and the arguments class it takes: probes call it instead of building the model
    trainer: str = ""
    args_class: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "task", Task(self.task))

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
    memory_limit_bytes: int | None  # the budget less the headroom: enforced in the child
    warmup_steps: int = 3
    measure_steps: int = 5
    seed: int = 0
    # The TrainingArguments fields the probe runs with (the user's base fields + the
    # candidate's), exactly what export writes; empty: the candidate's alone.
    training_arguments: dict[str, Any] = dataclasses.field(default_factory=dict)
    concurrent: int = 1  # probes sharing the machine's cores while this one runs
    data_path: str = ""  # the user's tokenized data: real batches are timed after the worst case
    # A user's job whose padding is searched: their own batches are timed after the worst
    # case (padding-free gains only where batches have padding)
    own_batches: bool = False
    # A user's job: their longest samples' indices, longest first, as the survey read them
    longest_samples: tuple[int, ...] = ()
    # A candidate whose steps train other samples than the recipe's (packed rows): the
    # user's mean sample length, by which its steps' tokens count in samples
    sample_tokens: float = 0.0
    pad_token_id: int = 0
    nproc_per_node: int = 1  # >1: a DDP run of this many processes, launched by torchrun
    # >1: the run spans this many nodes (core/nodes.py), each of nproc_per_node processes,
    # meeting at `rendezvous` (the head's host:port, fresh each run) under the run's
    # `rendezvous_id`; `node_rank`: this node's (the head's 0)
    nnodes: int = 1
    node_rank: int = 0
    rendezvous: str = ""
    rendezvous_id: str = ""
    # CUDA: what the probe sets CUDA_VISIBLE_DEVICES to before CUDA starts ("": leave it),
    # so a single-process probe sees exactly its one GPU.
    visible_devices: str = ""
    # >0: measure until the window lasts this long (fast devices), not a fixed step count
    min_measure_s: float = 0.0
    # >0: a parity run (core/parity.py): train this many steps on learnable data and
    # record the held-out loss curve; no timing
    parity_steps: int = 0
    # Not empty: a rehearsal (core/rehearsal.py) of the run's memory events: "evaluate",
    # "save" (bools), "fields" (the run's evaluation and save settings), "eval_samples"
    # (a stand-in's synthetic evaluation set)
    rehearsal: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Adaptive measurement (core/schedule.py): warm-up until steady (at most
    # warmup_steps), measure until rankable against the incumbent (at most
    # measure_steps). incumbent_s: the best cost so far, a step time, or with
    # train_steps the time to finish the user's run
    adaptive: bool = False
    incumbent_s: float | None = None
    train_steps: int = 0

    @property
    def device_kind(self) -> DeviceKind:
        return DeviceKind(self.device.split(":")[0])

    @property
    def device_index(self) -> int:
        return int(self.device.split(":")[1]) if ":" in self.device else 0

    @property
    def global_batch_size(self) -> int:
        c = self.candidate
        return (
            c.per_device_train_batch_size
            * c.gradient_accumulation_steps
            * self.nproc_per_node
            * self.nnodes
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrialConfig:
        raw = json.loads(text)
        if "memory_budget_bytes" in raw:  # written before the field was named for what it is
            raw["memory_limit_bytes"] = raw.pop("memory_budget_bytes")
        if raw.pop("base_arguments", None):
            raise ValueError("this config.json predates autotune 0.2; rerun the search")
        raw["model"] = ModelSpec(**raw["model"])
        raw["candidate"] = Candidate(**raw["candidate"])
        raw["longest_samples"] = tuple(raw.get("longest_samples", ()))
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
    # What configs are ranked by (core/stats.py): a run's lower quartile of step times;
    # pooled runs, the mean of theirs. None: not measured (or an older study's result).
    step_time_quiet_s: float | None = None
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
    # Packed rows: the samples (of the data's mean length) a timed step trained, where
    # its step times are those of the global batch's (probe/_train.per_global_batch)
    samples_per_step: float | None = None
    # The memory the probe process held before training (CPU: data segment and resident
    # set after the imports; CUDA: the context and how it was measured).
    baseline: dict[str, Any] = dataclasses.field(default_factory=dict)
    # A parity run: the held-out loss at each evaluated step, (step, loss)
    curve: tuple[tuple[int, float], ...] = ()
    # A probe: each optimizer step's training loss (the same batches in every probe of a
    # study, from the same weights: its own parity evidence)
    step_losses: tuple[float, ...] = ()
    # What the run paid once, beyond its steady steps: setup, compilation, the slow
    # first steps (the warm-up's time less warm-up steps at the measured median)
    one_time_s: float | None = None
    attention: str = ""  # the attention implementation the model ran with
    warmup_steps: int | None = None  # warm-up steps the run took (adaptive: until steady)
    measure_stop: str = ""  # adaptive measurement: why the window closed
    # Measured by another study and taken over, not probed again ("study S trial N")
    reused_from: str = ""
    pooled_runs: int = 1  # measured runs these figures pool (the probe + confirmations)
    # The memory limit the probe ran under, read back from where it is enforced
    # (probe/device.limit_in_force); None: none was set, or the run failed before it
    memory_limit_bytes: int | None = None
    # A CPU probe: the share of its optimizer's state that was subnormal after its steps
    # (sampled), and where that share counts (core/subnormals.py), how many times slower
    # this CPU multiplies such numbers. None: not measured (a GPU, a failed run).
    subnormal_share: float | None = None
    subnormal_slowdown: float | None = None

    def to_json(self) -> str:
        raw = dataclasses.asdict(self)
        raw["outcome"] = self.outcome.value
        return json.dumps(raw, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrialResult:
        """Parse a result; ValueError saying what is wrong on anything malformed (not
        JSON, another version's fields, a value of the wrong type)."""
        raw = check_fields(cls, parse_json(text))
        raw["outcome"] = Outcome(raw["outcome"])
        raw["step_times_s"] = tuple(float(t) for t in raw.get("step_times_s", ()))
        raw["curve"] = tuple((int(s), float(v)) for s, v in raw.get("curve", ()))
        raw["step_losses"] = tuple(float(v) for v in raw.get("step_losses", ()))
        return cls(**raw)

    def time_to_finish_s(self, steps: int) -> float | None:
        """One-time cost + `steps` optimizer steps at the measured median."""
        if self.step_time_median_s is None:
            return None
        return (self.one_time_s or 0.0) + steps * self.step_time_median_s

    @property
    def mfu(self) -> float | None:
        """Model FLOP utilisation: achieved model FLOP/s over the measured peak. None when
        either is unknown, or when training beat the peak (`mfu_unknown` says why): a
        utilisation above 100% is no utilisation, and is never shown."""
        if not self.model_flops_per_s or not self.peak_flops_per_s:
            return None
        ratio = self.model_flops_per_s / self.peak_flops_per_s
        return ratio if ratio <= 1.0 else None

    @property
    def mfu_unknown(self) -> str:
        """Why `mfu` is None although both figures were measured ('' otherwise)."""
        achieved, peak = self.model_flops_per_s, self.peak_flops_per_s
        if not achieved or not peak or achieved <= peak:
            return ""
        return (
            f"training ran {achieved / 1e9:.3g} GFLOP/s of model FLOPs, above the "
            f"{peak / 1e9:.3g} GFLOP/s measured as the peak: not the kernel training used"
        )

    def replace(self, **changes: Any) -> TrialResult:
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """A finished trial as the search and the reports see it."""

    number: int
    candidate: Candidate
    result: TrialResult  # pooled over the confirmation runs, when there are any
    runs: int = 1
    parity: Parity | None = None  # its training parity with the user's recipe, when judged
    # Its rehearsal of the run's evaluation and save (core/rehearsal.py), when rehearsed
    rehearsal: Rehearsal | None = None
    # Its confirmation runs made in interleaved rounds beside other finalists: (round,
    # the run's quiet step time), compared round by round (core/stats.paired_ratio)
    rounds: tuple[tuple[int, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a result means to the study: the values Optuna optimises and the constraint.

    `values` (samples/s, peak GiB) for a point the sampler learns from; None for a trial
    that tells it nothing (an error, a redundant proposal: `pruned`)."""

    values: tuple[float, float] | None
    constraint_gib: float | None  # <= 0: feasible (the peak within the budget less headroom)
    pruned: bool = False
