"""The job as the plan reads it, each fact resolved once before the search: what a
user's Trainer factory built (`JobFacts`: the model and what of it trains, the arguments
class, the data's lengths), the model's parameters as they are held (`ParameterCount`)
and what their arguments file fixes (`BaseArguments`). The plan derives the space and
the memory estimate from these, as it does from a --model's config."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Protocol

from autotune.core._typed import check_fields
from autotune.core.files import parse_json

FACTS_NAME = "facts.json"  # what the survey child writes beside its request


class SurveyServer(Protocol):
    """Where the survey's child can be forked from, its imports done (the search's fork
    server, launch/forkserver.EarlyServer)."""

    def survey(self, request: Path, stderr: Path, timeout_s: float) -> int | None:
        """The child's exit status on `request`, None past `timeout_s`; LaunchError
        where it cannot be run there."""


@dataclasses.dataclass(frozen=True)
class ParameterCount:
    total: int
    # In nn.Embedding modules (tied weights once): the Trainer gives these 32-bit state
    # under bitsandbytes' 8-bit optimizers
    embedding: int
    largest: int = 0  # the biggest single tensor: optimizers that step one at a time copy it
    trainable: int = 0  # those with gradients and optimizer state (a LoRA's ~1%); 0: all
    # Bytes the parameters that do not train take as they are held: 2 a parameter for a
    # bf16 checkpoint's frozen base, about half for a 4-bit one (scales included); 0 when
    # every parameter trains
    frozen_bytes: int = 0
    # The layers activation checkpointing grades (core/checkpointing.py); None where the
    # installed transformers cannot checkpoint one layer in N
    checkpoint_layers: int | None = None


@dataclasses.dataclass(frozen=True)
class BaseArguments:
    """What a search takes from the user's existing arguments file."""

    # per_device_train_batch_size x gradient_accumulation_steps: one process's samples
    # an optimizer step; the global batch is this times the processes (--nproc-per-node)
    process_batch_size: int | None
    seq_len: int | None
    target_len: int | None
    carried: dict[str, Any]  # their other TrainingArguments fields, run in every probe
    # Their own values of the fields the search tunes (precision, optimizer, checkpointing,
    # batch split): the recipe that parity runs compare the finalists with
    recipe: dict[str, Any] = dataclasses.field(default_factory=dict)
    train_steps: int | None = None  # their max_steps: the run a time-to-finish ranks by
    # Their fields the probe owns (output_dir, max_steps, logging, saving, evaluation):
    # not run by a probe, written back by the export so their run stays theirs
    kept: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class JobFacts:
    args_class: str  # dotted, importable: "trl.SFTConfig"
    args_fields: tuple[str, ...]  # the class's init fields: what --base-args may hold
    model_name: str  # the model's name_or_path, or its class
    model_class: str
    task: str
    config: dict[str, Any]  # the base model's config
    parameters: int
    trainable: int  # parameters with requires_grad: LoRA trains ~1% of them
    embedding: int
    largest: int
    adapter: dict[str, Any] = dataclasses.field(default_factory=dict)  # PEFT's config
    longest: int | None = None  # tokens in its longest sample; None: it has no input_ids
    # Its longest samples' indices, longest first (at most LONGEST_KEPT): read once here,
    # handed to every probe, which trains on them
    longest_samples: tuple[int, ...] = ()
    per_device_train_batch_size: int = 8  # from the arguments the factory was given
    gradient_accumulation_steps: int = 1
    max_length: int | None = None  # SFTConfig's max_length (or max_seq_length)
    # What the parameters are held in once the factory built the job: elements by
    # "frozen bfloat16", "trainable float32", "frozen 4-bit nf4"...
    held: dict[str, int] = dataclasses.field(default_factory=dict)
    frozen_bytes: int = 0  # bytes the frozen parameters take as held (0: all train)
    # A quantized base's loading: bits, quant_type, compute_dtype, double_quant ({}: none)
    quantization: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The factory turned activation checkpointing on although the arguments it was given
    # said off (prepare_model_for_kbit_training does): the Trainer never turns it off
    forced_checkpointing: bool = False
    # The layers checkpointing grades (hf.models.checkpoint_layers); None: not gradable
    checkpoint_layers: int | None = None
    samples: int | None = None  # the train dataset's samples, when it has a length
    tokens: int | None = None  # their tokens, when it exposes them
    # The tuned fields of the user's own arguments as their class builds them (its
    # defaults included: SFTConfig's bf16 and gradient checkpointing): their recipe
    recipe: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The optimizer the factory built the Trainer with (`optimizers=`), by class name:
    # every probe trains it, whatever `optim` says ("": the Trainer builds it from optim)
    own_optimizer: str = ""
    # How the Trainer builds its batches: its collator's class, dotted; whether it packs
    # samples (SFTConfig's packing) and whether it flattens them without padding already
    # (SFTConfig's padding-free mode, or packing with best-fit decreasing)
    collator: str = ""
    attention: str = ""  # the attention kernel the built model runs ("": not said)
    packing: bool = False
    flattens: bool = False
    # The save and load methods their Trainer class overrides ("": the library's own)
    own_save: str = ""
    # The model scores tokens through TRL's fused LM head (SFTTrainer patches its forward
    # so): the logits are folded in tiles, never held whole (tuning/estimate.logit_bytes)
    fused_head: bool = False

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobFacts:
        """ValueError saying what is wrong on anything that is not this version's facts."""
        raw = parse_json(text)
        if isinstance(raw, dict):  # facts without the class's fields: none known
            raw = {"args_fields": [], **raw}
        raw = check_fields(cls, raw)
        raw["args_fields"] = tuple(raw["args_fields"])
        raw["longest_samples"] = tuple(raw.get("longest_samples", ()))
        return cls(**raw)
