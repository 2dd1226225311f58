"""Which levers beyond the classic five a search offers here, and why the others are not.

Each lever has an availability rule (the device, the installed packages, the model) and
the values it is searched over. A lever the user fixed (a field of --base-args, or
`--lever NAME=VALUE`) is run at that value and not searched. Reasons for every lever
not searched are kept in the space, so `show` can say why.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.core.enums import DeviceKind, Task
from autotune.core.errors import UsageError
from autotune.core.job import JobFacts
from autotune.core.levers import (
    ATTENTION,
    BY_NAME,
    DECLARED,
    FSDP,
    FSDP_MODES,
    LIGER,
    LOADER_WORKERS,
    PACKING,
    PADDING_FREE,
    TORCH_COMPILE,
    ZERO_STAGE,
    Lever,
)
from autotune.core.trial import LEVERS, ModelSpec
from autotune.hf._packing import packing_error
from autotune.hf.models import auto_class, transformers_config
from autotune.hf.sharding import cpu_op_error

# Deferred imports: transformers and liger-kernel load only when a lever's offer is checked;
# a probe imports this module before it has chosen its GPU

MAX_LOADER_WORKERS = 4


# ZeRO offload is not a lever: it was never run on GPUs (on the CPU the states it moves to
# host memory are there already). Said by `show` with the others.
NOT_BUILT = (
    (
        "zero_offload",
        "ZeRO offload moves optimizer state to host memory to fit a GPU; autotune has "
        "not run it on GPUs, and on the CPU the state is in host memory already",
    ),
)


def attention_kernel(model: Any) -> str:
    """The attention kernel a built model runs ("" when its config does not say)."""
    return str(getattr(model.config, "_attn_implementation", "") or "")


def parse_lever_options(options: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """`--lever NAME=V1,V2` options as {name: values}; UsageError on anything off."""
    asked: dict[str, tuple[Any, ...]] = {}
    for option in options:
        name, sep, text = option.partition("=")
        name = name.strip()
        if not sep or name not in LEVERS or not text.strip():
            raise UsageError(
                f"--lever {option!r}: write NAME=VALUE[,VALUE...] with NAME one of "
                f"{', '.join(LEVERS)} (e.g. --lever torch_compile=false)"
            )
        try:
            parse = BY_NAME[name].parse
            values = tuple(dict.fromkeys(parse(v.strip()) for v in text.split(",")))
        except ValueError as exc:
            raise UsageError(f"--lever {option!r}: {exc}") from None
        asked[name] = values
    return asked


def offer(
    model: ModelSpec,
    device_kind: DeviceKind,
    *,
    dataset: bool,
    fixed: Mapping[str, Any],
    asked: Mapping[str, tuple[Any, ...]],
    nproc_per_node: int = 1,
    own_deepspeed: bool = False,
    own_fsdp: bool = False,
    job: JobFacts | None = None,
) -> tuple[list[tuple[str, tuple[Any, ...]]], list[tuple[str, str]]]:
    """(levers with the values to search, [(lever, why it is not searched)]).
    `own_deepspeed`, `own_fsdp`: the user's base arguments carry a DeepSpeed or FSDP
    config of their own, which every probe runs as given. `job`: what the user's factory
    built, when the search tunes their job."""
    factory = bool(model.trainer)  # the user's factory builds the model and the batches
    # Each declared lever's rule (core/levers.py): the values offered here, or why none
    available: dict[Lever, tuple[tuple[Any, ...], str]] = {
        TORCH_COMPILE: _compile(device_kind),
        ATTENTION: (
            ((), "your factory builds the model: set attn_implementation where it loads it")
            if factory
            else _attention(model, device_kind)
        ),
        LIGER: _liger(model, device_kind),
        PADDING_FREE: _padding_free(model, dataset, job, PADDING_FREE.name in asked),
        PACKING: _packing(model, job, PACKING.name in asked),
        LOADER_WORKERS: _loader_workers(dataset),
        ZERO_STAGE: _zero(device_kind, nproc_per_node, own_deepspeed, own_fsdp),
        FSDP: _fsdp(device_kind, nproc_per_node, (own_deepspeed, own_fsdp), FSDP.name in asked),
    }
    levers: list[tuple[str, tuple[Any, ...]]] = []
    reasons: list[tuple[str, str]] = list(NOT_BUILT)
    for lever in DECLARED:
        name = lever.name
        values, why = available[lever]
        if name in fixed:
            levers.append((name, (fixed[name],)))
            reasons.append((name, f"set to {fixed[name]!r} by --base-args"))
            continue
        if name in asked:
            wanted = asked[name]
            # a lever's plain value (off, no workers) is always allowed
            refused = [v for v in wanted if v not in values and not BY_NAME[name].is_plain(v)]
            if refused:
                raise UsageError(
                    f"--lever {name}={','.join(map(str, wanted))}: {refused[0]!r} is not "
                    f"available here ({why or 'offered: ' + ', '.join(map(str, values))})"
                )
            values, why = wanted, "" if len(wanted) > 1 else "fixed by --lever"
        if len(values) > 1:
            levers.append((name, values))
            if why:  # searched, some values not offered
                reasons.append((name, why))
        else:
            if values:
                levers.append((name, values))
            reasons.append((name, why))
    return levers, reasons


def _compile(kind: DeviceKind) -> tuple[tuple[Any, ...], str]:
    if kind == DeviceKind.CUDA:
        if importlib.util.find_spec("triton") is None:
            return (), "torch.compile on CUDA needs triton, which is not installed"
        return (False, True), ""
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None:
        return (), f"torch.compile on the CPU needs a C++ compiler ({compiler} not found)"
    return (False, True), ""


def model_class(model: ModelSpec) -> Any:
    """The transformers class a probe builds for this model (not instantiated)."""

    mapping = auto_class(model.task)._model_mapping
    return mapping[type(transformers_config(model.config))]


def _attention(model: ModelSpec, kind: DeviceKind) -> tuple[tuple[Any, ...], str]:
    from transformers.utils.import_utils import is_flash_attn_2_available

    cls = model_class(model)
    choices = ["eager"]
    why = []
    if getattr(cls, "_supports_sdpa", False):
        choices.insert(0, "sdpa")  # the model's default first
    if not getattr(cls, "_supports_flash_attn", False):
        why.append(f"{cls.__name__} has no flash attention")
    elif kind != DeviceKind.CUDA or not is_flash_attn_2_available():
        why.append("flash_attention_2 needs the flash-attn package and a CUDA GPU")
    else:
        choices.append("flash_attention_2")
    dropout = _attention_dropout(transformers_config(model.config))
    if not getattr(cls, "_supports_flex_attn", False):
        pass
    elif kind != DeviceKind.CUDA:
        why.append("flex_attention has no backward pass on the CPU")
    elif dropout:
        # transformers' flex_attention_forward raises on any dropout > 0 in training
        why.append(f"flex_attention does not train with attention dropout ({dropout})")
    else:
        choices.append("flex_attention")
    return tuple(choices), "; ".join(why)


# Where configs keep the dropout their attention layers apply in training.
_ATTENTION_DROPOUT = (
    "attention_dropout",
    "attn_pdrop",
    "attention_probs_dropout_prob",
    "attn_dropout",
    "dropout_rate",  # T5, mT5: one rate, attention included
)


def _attention_dropout(config: Any) -> str:
    """'name = value' of the attention dropout a (transformers) config trains with, when
    above 0, else ''. The defaults count: GPT-2's attn_pdrop is 0.1 unless set."""
    for name in _ATTENTION_DROPOUT:
        value = getattr(config, name, None)
        if isinstance(value, int | float) and value > 0:
            return f"{name} = {value}"
    return ""


def _liger(model: ModelSpec, kind: DeviceKind) -> tuple[tuple[Any, ...], str]:
    if importlib.util.find_spec("liger_kernel") is None:
        return (), "liger-kernel is not installed (pip install liger-kernel)"
    if kind != DeviceKind.CUDA:
        return (), "liger kernels are Triton kernels: they need a GPU"
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as exc:
        return (), f"liger-kernel does not import ({exc})"
    model_type = str(model.config.get("model_type"))
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        return (), f"liger-kernel has no kernels for model type {model_type!r}"
    return (False, True), ""


def _padding_free(
    model: ModelSpec, dataset: bool, job: JobFacts | None, asked: bool
) -> tuple[tuple[Any, ...], str]:
    """The stand-in's padding-free batches (with --dataset: the probe's collator), or the
    user's job's (their SFTTrainer's)."""
    if job is not None:
        return _sft_padding_free(model, job, asked)
    if not dataset:
        return (), "padding-free batches need your data (--dataset): probes have no padding"
    if model.task != Task.CAUSAL_LM:
        return (), f"padding-free batches are for causal LMs; this is {model.task}"

    error = packing_error(model)
    if error:
        return (), error
    return (False, True), ""


def flattens_batches(trainer: Any) -> bool:
    """Whether a user's Trainer flattens its batches without padding already: TRL's
    SFTTrainer does under `padding_free`, or packing with best-fit decreasing."""
    return getattr(trainer, "padding_free", False) is True


def _sft_padding_free(model: ModelSpec, job: JobFacts, asked: bool) -> tuple[tuple[Any, ...], str]:
    """Padding-free batches in the user's job: TRL's SFTTrainer builds them itself when
    their SFTConfig says `padding_free`, from its own collator, without packing; it
    refuses them while `max_length` is set (it could no longer truncate), so they are
    offered only where no sample of the data reaches it: `max_length` then goes too, and
    their samples stay as they are. They pay with an attention kernel that skips what
    the flattened row masks out (flash attention's variable-length kernels, flex
    attention's block mask); sdpa and eager attend over the whole row under a mask, a
    (batch x length)^2 cost, so there they are searched only when `asked`."""
    if "padding_free" not in job.args_fields:
        name = job.args_class.rsplit(".", 1)[-1]
        return (), f"your factory's collator builds the batches ({name} has no padding_free)"
    if job.flattens:
        return (), "your SFTTrainer flattens the batches already (padding_free, or bfd packing)"
    if job.packing:
        return (), "your SFTConfig packs samples into full rows: there is no padding to drop"
    if not job.collator.startswith("trl."):
        return (), (
            f"your factory passes its own data_collator ({job.collator.rsplit('.', 1)[-1]}); "
            "SFTTrainer's padding-free batches need its own"
        )
    if model.task != Task.CAUSAL_LM:
        return (), f"padding-free batches are for causal LMs; this is {model.task}"
    if job.max_length is not None and (job.longest is None or job.longest >= job.max_length):
        reach = (
            f"your data reaches max_length {job.max_length}"
            if job.longest is not None
            else "your dataset's lengths are unknown"
        )
        return (), (
            "SFTTrainer takes padding_free without packing only with max_length null, and "
            f"{reach}: its samples would no longer be truncated"
        )
    if not asked and not _skips_masked(job.attention):
        return (), (
            f"padding-free batches pay with flash or flex attention; your model runs "
            f"{job.attention or 'its default attention'}, which attends over the whole "
            "flattened row ((batch x length)^2): load it with "
            'attn_implementation="flash_attention_2", or --lever padding_free=false,true'
        )
    error = packing_error(model)
    if error:
        return (), error
    return (False, True), ""


def _packing(model: ModelSpec, job: JobFacts | None, asked: bool) -> tuple[tuple[Any, ...], str]:
    """Packed rows in the user's job: TRL's SFTTrainer fills rows of `max_length` tokens
    with whole samples (best-fit decreasing), flattened as padding-free batches are. A
    step then trains several samples a row, not the recipe's: a change of the training
    itself, which no parity run pairs with the recipe's, so searched only when `asked`,
    and exported only for a significant gain, said."""
    if job is None:
        return (), "packing is your SFTTrainer's (--trainer with an SFTConfig)"
    if "packing" not in job.args_fields:
        name = job.args_class.rsplit(".", 1)[-1]
        return (), f"your factory's collator builds the batches ({name} has no packing)"
    if job.packing:
        return (), "your SFTConfig packs already"
    if not asked:
        return (), (
            "packed rows train several samples a step, not your recipe's: a change of "
            "your training, searched where asked (--lever packing=false,true); like "
            "padding-free batches they pay with flash or flex attention"
        )
    if job.max_length is None:
        return (), "SFTTrainer packs rows of max_length tokens, and your max_length is null"
    if not job.collator.startswith("trl."):
        return (), (
            f"your factory passes its own data_collator ({job.collator.rsplit('.', 1)[-1]}); "
            "SFTTrainer packs only with its own"
        )
    if model.task != Task.CAUSAL_LM:
        return (), f"packing is for causal LMs; this is {model.task}"
    error = packing_error(model)
    if error:
        return (), error
    return (False, True), ""


def _skips_masked(attention: str) -> bool:
    """Whether an attention kernel skips the blocks a flattened row's mask leaves out."""
    return "flash" in attention or attention == "flex_attention"


def _loader_workers(dataset: bool) -> tuple[tuple[Any, ...], str]:
    if not dataset:
        return (), "loader workers need your data (--dataset): probes build their batches"
    workers = min(MAX_LOADER_WORKERS, (os.cpu_count() or 1) - 1)
    if workers < 1:
        return (), "one core: no core to spare for a loader worker"
    return (0, workers), ""


def _zero(
    kind: DeviceKind, nproc_per_node: int, own: bool, own_fsdp: bool
) -> tuple[tuple[Any, ...], str]:
    """DeepSpeed ZeRO stages 1-3 against plain DDP, for multi-process probes."""
    if own:
        return (), "your --base-args set deepspeed: every probe runs your config as given"
    if own_fsdp:
        return (), "your --base-args set fsdp: the Trainer refuses DeepSpeed beside it"
    if nproc_per_node < 2:
        return (), "ZeRO shards across processes: it needs --nproc-per-node 2 or more"
    if importlib.util.find_spec("deepspeed") is None:
        return (), "DeepSpeed is not installed (pip install deepspeed)"
    if kind == DeviceKind.CPU:  # its collectives go through a C++ op built on first use
        error = cpu_op_error()
        if error:
            return (), error
    return (0, 1, 2, 3), ""


def _fsdp(
    kind: DeviceKind, nproc_per_node: int, own: tuple[bool, bool], asked: bool
) -> tuple[tuple[Any, ...], str]:
    """FSDP2 through the Trainer against plain DDP, for multi-process probes on GPUs;
    CPU offload only when asked (it trades speed for memory a GPU lacks). `own`: the
    user's base arguments set deepspeed, fsdp."""
    if own[0]:
        return (), "your --base-args set deepspeed: the Trainer refuses FSDP beside it"
    if own[1]:
        return (), "your --base-args set fsdp: every probe runs your config as given"
    if nproc_per_node < 2:
        return (), "FSDP shards across processes: it needs --nproc-per-node 2 or more"
    if kind != DeviceKind.CUDA:
        # accelerate's state.py makes a run FSDP only on GPU backends: with use_cpu the
        # Trainer drops the plugin and runs DDP, so a probe would time DDP under its name
        return (), "FSDP through the Trainer runs on GPUs only (on the CPU accelerate runs DDP)"
    modes = tuple(mode for mode in FSDP_MODES if asked or mode != "offload")
    return ("", *modes), ""
