"""The levers beyond batch, precision, checkpointing and optimizer, each declared once.

A lever is one record: its name (the `Candidate` field, and what users write after
`--lever NAME=`), how its values are read, when it is offered (the help's words; the
rule that reads the device, the installed packages and the model is
in `hf/levers.offer`, keyed by these records), how `describe` names a value other than the
plain one, whether it moves a probe's memory (the skip family), the `TrainingArguments`
fields and model arguments a value sets, the lines the user's script needs besides the
arguments file, what it does that the probe, the estimate and the summary must know (a
compile paid once, batches without padding, the training's state sharded), and which
engine runs its arithmetic (parity's class). The CLI's help, `describe`, the family, the
export's fields and lines, the estimate's sharding and parity read these records; the
rest of autotune asks a `Candidate` what its levers do, never for a lever by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any


def boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "on", "1", "yes"):
        return True
    if lowered in ("false", "off", "0", "no"):
        return False
    raise ValueError(f"{text!r} is not true/false")


def _none(value: Any) -> dict[str, Any]:
    return {}


def _no_lines(value: Any) -> list[str]:
    return []


def _unsharded(value: Any) -> int:
    return 0


def _never(value: Any) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class Lever:
    name: str  # the Candidate field; --lever NAME=...
    parse: Callable[[str], Any]  # one value as a user writes it
    offered_when: str  # for --lever's help and the docs
    label: Callable[[Any], str]  # describe's word for a value other than the plain one
    plain: Any = False  # the plain run's value (the Candidate's default)
    in_family: bool = True  # False: a probe's memory is the same whatever its value
    # The TrainingArguments fields a value other than the plain one sets, and every
    # field it may set (the search owns them: a base file's values are replaced)
    fields: Callable[[Any], dict[str, Any]] = _none
    owns: tuple[str, ...] = ()
    model_arguments: Callable[[Any], dict[str, Any]] = _none  # from_pretrained's kwargs
    script_lines: Callable[[Any], list[str]] = _no_lines  # what the arguments file cannot say
    # The fields of the user's own arguments class that a value sets where their factory
    # builds the Trainer (TRL's SFTConfig: its offer rule checked the class has them);
    # the stand-in's probe does the same itself, and script_lines tell the user how
    class_fields: Callable[[Any], dict[str, Any]] = _none
    # What a value other than the plain one does besides its fields: its first steps pay
    # a compile (probes keep a cold cache of their own; the summary weighs it once), the
    # batches are flattened without padding (the probe's collator, the user's), the
    # ZeRO stage the training's state is sharded at (the estimate divides it)
    compiles: bool = False
    flattens_batches: bool = False
    shard_stage: Callable[[Any], int] = _unsharded
    # The training's state lives in host memory between its uses (FSDP's CPU offload):
    # the device holds the layers being computed, not the shards
    offloads: Callable[[Any], bool] = _never
    # A value other than the plain one changes the samples a step trains on (packing
    # fills each row with several): its arithmetic is not the recipe's, its probes train
    # other batches (their losses pair with no other probe's), its step times are
    # compared per token, and its worst case is a full row
    changes_samples: bool = False
    # Levers whose non-plain value this one's non-plain value does already (packed rows
    # are flattened): a candidate with both set is the same run as with this one alone
    implies: tuple[str, ...] = ()
    # Levers whose non-plain value cannot run beside this one's (the Trainer refuses FSDP
    # beside DeepSpeed): a candidate with both set is no run at all
    excludes: tuple[str, ...] = ()
    # The engine that runs 16-bit arithmetic at a value other than the plain one ("": the
    # Trainer's autocast): a change between engines may change the sums, parity says so
    engine: str = ""

    def is_plain(self, value: Any) -> bool:
        return bool(value == self.plain)


def deepspeed_config(stage: int) -> dict[str, Any]:
    """The `deepspeed` field of TrainingArguments for a ZeRO stage (1-3).

    Batch sizes, clipping and precision are left to the Trainer ("auto": filled in from
    the TrainingArguments it sits in), buffers sized by the model ("auto": from its
    hidden size, where DeepSpeed's defaults reserve 2 GB whatever the model), and no
    optimizer named, so the Trainer's own (the candidate's) is the one ZeRO shards.
    Under stage 3 a save gathers the full 16-bit weights, so the user's `save_model`
    writes a model that loads without DeepSpeed."""
    if stage not in (1, 2, 3):
        raise ValueError(f"ZeRO stage {stage}: stages are 1, 2 and 3")
    zero: dict[str, Any] = {"stage": stage, "reduce_bucket_size": "auto"}
    if stage == 3:
        zero["stage3_prefetch_bucket_size"] = "auto"
        zero["stage3_param_persistence_threshold"] = "auto"
        # each process holds a shard of the weights: without this, `save_model` writes
        # no full weights (only the shards a ZeRO checkpoint holds)
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "zero_optimization": zero,
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "fp16": {"enabled": "auto"},
        "bf16": {"enabled": "auto"},
    }


DEEPSPEED = "deepspeed"  # ZeRO's engine: its own 16-bit weights and optimizer step
FSDP_MODES = {  # a value of the fsdp lever: (describe's label, FSDP2's settings)
    "full_shard": ("fsdp", {"reshard_after_forward": True}),
    "shard_grad_op": ("fsdp-grad-op", {"reshard_after_forward": False}),
    "offload": ("fsdp-offload", {"reshard_after_forward": True, "cpu_offload": True}),
}


def fsdp_mode(text: str) -> str:
    """An fsdp_mode value as a user writes it ("off": plain DDP)."""
    if text.lower() in ("", "off", "false", "no", "none"):
        return ""
    if text not in FSDP_MODES:
        raise ValueError(f"{text!r} is not one of off, {', '.join(FSDP_MODES)}")
    return text


def fsdp_config(mode: str) -> dict[str, Any]:
    """The `fsdp_config` field of TrainingArguments for an FSDP2 mode.

    Each decoder layer its own unit (the model's `_no_split_modules`, accelerate's
    transformer wrap); full-shard frees a layer's gathered weights after its forward,
    shard-grad-op keeps them to the backward (ZeRO-2's trade: more memory, one gather
    less); offload keeps the shards in host memory. `save_model` gathers the full state
    dict, so the user's saved model loads without FSDP; checkpoints resume under FSDP."""
    if mode not in FSDP_MODES:
        raise ValueError(f"FSDP mode {mode!r}: modes are {', '.join(FSDP_MODES)}")
    return {
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "state_dict_type": "FULL_STATE_DICT",
        "cpu_offload": False,
        **FSDP_MODES[mode][1],
    }


def _fsdp_stage(mode: str) -> int:
    """The ZeRO stage an FSDP mode shards like at its peak: full shard splits weights,
    gradients and state (3); shard-grad-op holds the gathered weights from the forward
    to the backward, so its peak holds them whole (2)."""
    return 2 if mode == "shard_grad_op" else 3


def shards(stage: int, nproc_per_node: int) -> tuple[int, int, int]:
    """How many ways (weights, gradients, optimizer state) are split across processes:
    stage 1 splits the optimizer state, 2 the gradients too, 3 the weights too."""
    n = max(1, nproc_per_node)
    return (n if stage >= 3 else 1, n if stage >= 2 else 1, n if stage >= 1 else 1)


def _zero_lines(stage: int) -> list[str]:
    lines = [
        f"ZeRO stage {stage} runs through DeepSpeed: pip install deepspeed where you train "
        "(its config is the deepspeed field of the arguments file)"
    ]
    if stage == 3:
        lines.append(
            "build the model after TrainingArguments (from_pretrained then loads each "
            "process's shard, as the probe did)"
        )
    return lines


TORCH_COMPILE = Lever(
    "torch_compile",
    boolean,
    "a C++ compiler on the CPU, triton on CUDA",
    label=lambda _: "compiled",
    fields=lambda _: {"torch_compile": True},
    owns=("torch_compile",),
    compiles=True,
)
ATTENTION = Lever(
    "attn_implementation",
    str,
    "sdpa, eager; flash_attention_2 and flex_attention on CUDA, those the model supports",
    label=str,
    plain="",  # the model's own default
    model_arguments=lambda kernel: {"attn_implementation": kernel},
    script_lines=lambda kernel: [
        f'load the model with attn_implementation="{kernel}": '
        f'AutoModel...from_pretrained(name, attn_implementation="{kernel}")'
    ],
)
LIGER = Lever(
    "use_liger_kernel",
    boolean,
    "liger-kernel on CUDA, for the model types it covers",
    label=lambda _: "liger",
    fields=lambda _: {"use_liger_kernel": True},
    owns=("use_liger_kernel",),
)
PADDING_FREE = Lever(
    "padding_free",
    boolean,
    "--dataset or your SFTTrainer's own, causal LMs whose loss is unchanged on a checked batch",
    label=lambda _: "padding-free",
    script_lines=lambda _: [
        "batch without padding: Trainer(..., data_collator=DataCollatorWithFlattening()) "
        "(from transformers)"
    ],
    # SFTTrainer builds the flattened batches; without packing it refuses a max_length,
    # which it would no longer apply (offered only where the data never reaches it)
    class_fields=lambda _: {"padding_free": True, "max_length": None},
    flattens_batches=True,
)
PACKING = Lever(
    "packing",
    boolean,
    "asked for (--lever packing=false,true), your SFTTrainer's own, with a max_length",
    label=lambda _: "packed",
    # SFTTrainer packs with best-fit decreasing: whole samples, flattened, the position
    # ids restarting at each (the probe counts them, and the user's run does the same)
    class_fields=lambda _: {"packing": True, "packing_strategy": "bfd"},
    flattens_batches=True,
    changes_samples=True,
    implies=("padding_free",),
)
LOADER_WORKERS = Lever(
    "dataloader_num_workers",
    int,
    "--dataset, a spare core",
    label=lambda workers: f"{workers}-workers",
    plain=0,
    # probes measure memory on worst-case batches, whichever processes load them
    in_family=False,
    fields=lambda workers: {
        "dataloader_num_workers": workers,
        "dataloader_persistent_workers": True,  # no new workers at each epoch
    },
    owns=("dataloader_num_workers", "dataloader_persistent_workers"),
)
ZERO_STAGE = Lever(
    "zero_stage",
    int,
    "DeepSpeed ZeRO 0-3 against plain DDP, with --nproc-per-node 2+ and deepspeed installed",
    label=lambda stage: f"zero{stage}",
    plain=0,
    fields=lambda stage: {"deepspeed": deepspeed_config(stage)},
    script_lines=_zero_lines,
    shard_stage=int,
    # ZeRO's sums are DDP's, but in 16 bits DeepSpeed does the mixed precision itself
    engine=DEEPSPEED,
)
FSDP = Lever(
    "fsdp_mode",
    fsdp_mode,
    "FSDP2 full_shard and shard_grad_op (offload when asked) against plain DDP, on CUDA "
    "with --nproc-per-node 2+, never beside your own DeepSpeed config",
    label=lambda mode: FSDP_MODES[mode][0],
    plain="",
    # not owned: a --base-args fsdp config is the user's, carried and run as given
    fields=lambda mode: {"fsdp": True, "fsdp_config": fsdp_config(mode)},
    script_lines=lambda mode: [
        "FSDP runs through accelerate under torchrun: its settings are the fsdp and "
        "fsdp_config fields of the arguments file (save_model writes the full weights)"
    ],
    shard_stage=_fsdp_stage,
    offloads=lambda mode: mode == "offload",
    excludes=("zero_stage",),
    # FSDP's sums in 32 bits are DDP's (the same losses, step for step); in 16 bits its
    # mixed-precision policy computes every op and reduces the gradients in 16 bits,
    # where the Trainer's autocast keeps the reductions and the weights in 32
    engine="fsdp",
)
DECLARED = (
    TORCH_COMPILE,
    ATTENTION,
    LIGER,
    PADDING_FREE,
    PACKING,
    LOADER_WORKERS,
    ZERO_STAGE,
    FSDP,
)
BY_NAME = {lever.name: lever for lever in DECLARED}


@dataclasses.dataclass(frozen=True)
class SetLevers:
    """The levers a config sets away from their plain values, with their values, and
    what they do together, as their declarations say."""

    pairs: tuple[tuple[Lever, Any], ...]

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> SetLevers:
        return cls(
            tuple(
                (lever, values[lever.name])
                for lever in DECLARED
                if not lever.is_plain(values[lever.name])
            )
        )

    def __iter__(self) -> Iterator[tuple[Lever, Any]]:
        return iter(self.pairs)

    @property
    def compiles(self) -> bool:
        """Its first steps pay a compile."""
        return any(lever.compiles for lever, _ in self)

    @property
    def flattens_batches(self) -> bool:
        """Its batches are rows packed without padding (a flattening collator)."""
        return any(lever.flattens_batches for lever, _ in self)

    @property
    def changes_samples(self) -> bool:
        """Its steps train other samples than the recipe's (packed rows hold several)."""
        return any(lever.changes_samples for lever, _ in self)

    @property
    def clash(self) -> str:
        """Why it cannot run at all ("" when it can): two levers set that exclude each
        other (FSDP beside DeepSpeed's ZeRO)."""
        return self._beside(lambda lever: lever.excludes, "cannot run beside")

    @property
    def redundant(self) -> str:
        """Why it is the same run as another config ("" when it is not): a lever set
        that another set does already (packed rows are flattened)."""
        return self._beside(lambda lever: lever.implies, "does what", " does already")

    def _beside(self, named: Callable[[Lever], Iterable[str]], says: str, end: str = "") -> str:
        names = {lever.name for lever, _ in self}
        for lever, _ in self:
            beside = sorted(names.intersection(named(lever)))
            if beside:
                return f"{lever.name} {says} {', '.join(beside)}{end}"
        return ""

    @property
    def shard_stage(self) -> int:
        """The ZeRO stage its training's state is sharded at over the processes (0: none)."""
        return max((lever.shard_stage(value) for lever, value in self), default=0)

    @property
    def offloads(self) -> bool:
        """Its training's state lives in host memory between its uses."""
        return any(lever.offloads(value) for lever, value in self)

    @property
    def engine(self) -> str:
        """The engine that runs its 16-bit arithmetic ("": the Trainer's autocast)."""
        return next((lever.engine for lever, _ in self if lever.engine), "")


def model_arguments(values: Mapping[str, Any]) -> dict[str, Any]:
    """What levers at these values pass to the model's from_pretrained/from_config (the
    attention kernel), not to TrainingArguments: a lever absent or plain passes none."""
    found: dict[str, Any] = {}
    for lever in DECLARED:
        if lever.name in values and not lever.is_plain(values[lever.name]):
            found.update(lever.model_arguments(values[lever.name]))
    return found


def lever_help() -> str:
    """--lever's help: each lever and when it is offered."""
    each = ", ".join(f"{lever.name} ({lever.offered_when})" for lever in DECLARED)
    return (
        "Fix or narrow a lever (beyond batch, precision, checkpointing and optimizer); "
        f"each is searched where offered: {each}. `show` says why a lever was not "
        "offered. E.g. --lever torch_compile=false."
    )
