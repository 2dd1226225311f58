"""Reading a built Trainer: what its model trains and holds (PEFT adapters, each
parameter's dtype or quantization, checkpointing it turned on itself), and its train
dataset's lengths, so that probes can measure on the longest samples."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from autotune.core.job import JobFacts
from autotune.hf.factory import class_name
from autotune.hf.levers import attention_kernel, flattens_batches
from autotune.hf.models import detect_task, parameter_count, parameter_elements

# The Trainer's methods that save a checkpoint or load one back: where the user's class
# overrides one, what a save holds is theirs to say (as ZeRO-3's gathering of the weights)
SAVE_METHODS = ("_save_checkpoint", "save_model", "_save", "_load_from_checkpoint")
LIBRARIES = ("transformers.", "trl.", "peft.", "accelerate.")
LONGEST_KEPT = 4096  # the longest samples' indices a survey keeps: a global batch's worth

# Deferred imports: pyarrow and torch load only where the data is read (the survey, a probe);
# the planner imports this module without them


def job_facts(trainer: Any) -> JobFacts:
    """What the factory built, read off the Trainer it returned, built on arguments with
    activation checkpointing off (the survey's): checkpointing on in the model is the
    factory's own doing."""
    model = trainer.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config.to_dict()
    config.pop("quantization_config", None)  # the base's loading, not its architecture
    counted = parameter_count(model)
    args = trainer.args
    lengths = sample_lengths(trainer.train_dataset)
    length = getattr(args, "max_length", None) or getattr(args, "max_seq_length", None)
    return JobFacts(
        args_class=class_name(type(args)),
        args_fields=tuple(f.name for f in dataclasses.fields(type(args)) if f.init),
        model_name=str(getattr(base.config, "_name_or_path", "") or type(base).__name__),
        model_class=type(base).__name__,
        task=str(detect_task({**config, "architectures": [type(base).__name__]}) or ""),
        config=config,
        adapter=adapter_config(model),
        longest=max(lengths) if lengths else None,
        longest_samples=tuple(longest_first(lengths, LONGEST_KEPT)) if lengths else (),
        per_device_train_batch_size=int(args.per_device_train_batch_size),
        gradient_accumulation_steps=int(args.gradient_accumulation_steps),
        max_length=int(length) if isinstance(length, int) else None,
        parameters=counted.total,
        trainable=counted.trainable or counted.total,
        embedding=counted.embedding,
        largest=counted.largest,
        held=held_dtypes(model),
        frozen_bytes=counted.frozen_bytes,
        quantization=quantization_settings(base),
        forced_checkpointing=checkpointing(base),
        checkpoint_layers=counted.checkpoint_layers,
        samples=_length(trainer.train_dataset),
        own_optimizer=type(trainer.optimizer).__name__ if trainer.optimizer is not None else "",
        tokens=sum(lengths) if lengths else None,
        collator=class_name(type(trainer.data_collator)) if trainer.data_collator else "",
        packing=getattr(args, "packing", False) is True,
        flattens=flattens_batches(trainer),
        attention=attention_kernel(base),
        own_save=own_save(trainer),
        fused_head=fused_head(base),
    )


def fused_head(model: Any) -> bool:
    """Whether the model's forward is TRL's fused LM head (SFTTrainer patches it in: its
    loss folds the logits tile by tile). The patch wraps the model's own forward, so it
    is told by its code, not its name."""
    code = getattr(getattr(getattr(model, "forward", None), "__func__", None), "__code__", None)
    return code is not None and code.co_name == "_fused_forward" and "trl" in code.co_filename


def own_save(trainer: Any) -> str:
    """The save and load methods the user's Trainer class overrides ("Gathering.
    _save_checkpoint"), "" where the library's own run."""
    found = [
        f"{cls.__name__}.{name}"
        for cls in type(trainer).__mro__
        if not cls.__module__.startswith(LIBRARIES)
        for name in SAVE_METHODS
        if name in vars(cls)
    ]
    return ", ".join(found)


def held_dtypes(model: Any) -> dict[str, int]:
    """Parameters by what they are held in and whether they train: {"frozen bfloat16":
    ..., "trainable float32": ...}; a 4-bit tensor is named by its quantization."""
    held: dict[str, int] = {}
    for parameter in model.parameters():
        state = getattr(parameter, "quant_state", None)
        if state is not None:
            kind = f"4-bit {getattr(state, 'quant_type', '')}".strip()
        elif type(parameter).__name__ == "Int8Params":
            kind = "8-bit"
        else:
            kind = str(parameter.dtype).removeprefix("torch.")
        key = f"{'trainable' if parameter.requires_grad else 'frozen'} {kind}"
        held[key] = held.get(key, 0) + parameter_elements(parameter)
    return dict(sorted(held.items()))


def quantization_settings(model: Any) -> dict[str, Any]:
    """A quantized base's loading as its config records it: bits, the 4-bit type, the
    compute dtype, double quantization ({} for a full-precision base)."""
    config = getattr(getattr(model, "hf_quantizer", None), "quantization_config", None)
    if config is None:
        config = getattr(model.config, "quantization_config", None)
    if config is None:
        return {}
    raw = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    bits = 4 if raw.get("load_in_4bit") else 8 if raw.get("load_in_8bit") else raw.get("bits")
    settings = {
        "method": str(getattr(raw.get("quant_method"), "value", raw.get("quant_method", ""))),
        "bits": bits,
        "quant_type": raw.get("bnb_4bit_quant_type") if bits == 4 else None,
        "compute_dtype": str(raw.get("bnb_4bit_compute_dtype") or "").removeprefix("torch.")
        if bits == 4
        else None,
        "double_quant": raw.get("bnb_4bit_use_double_quant") if bits == 4 else None,
    }
    return {k: v for k, v in settings.items() if v not in (None, "")}


def checkpointing(model: Any) -> bool:
    """Whether activation checkpointing is on in the built model."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def adapter_config(model: Any) -> dict[str, Any]:
    """The PEFT adapter's settings ({} for a model without one)."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        return {}
    config = next(iter(configs.values()))
    raw = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))
    keep = ("peft_type", "r", "lora_alpha", "target_modules", "lora_dropout", "task_type")
    found = {k: raw[k] for k in keep if raw.get(k) is not None}
    for key, value in found.items():
        if isinstance(value, set):
            found[key] = sorted(value)
        elif not isinstance(value, (int, float, str, list)):
            found[key] = str(getattr(value, "value", value))
    return found


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:  # an iterable dataset
        return None


def sample_lengths(dataset: Any) -> list[int] | None:
    """Tokens in each sample, from a `length` or `input_ids` column (a datasets.Dataset,
    read as Arrow: no sample becomes Python) or item; None when the dataset does not
    expose them."""
    if dataset is None or _length(dataset) is None:
        return None
    columns = getattr(dataset, "column_names", None)
    if columns is not None:
        if "length" in columns:
            return [int(n) for n in _arrow_column(dataset, "length").to_numpy()]
        if "input_ids" in columns:
            import pyarrow.compute as pc

            ids = _arrow_column(dataset, "input_ids")
            return [int(n) for n in pc.list_value_length(ids).to_numpy(zero_copy_only=False)]
        return None
    try:
        return [len(dataset[i]["input_ids"]) for i in range(len(dataset))]
    except (KeyError, TypeError, IndexError):
        return None


def _arrow_column(dataset: Any, name: str) -> Any:
    """A datasets.Dataset's column as Arrow (its selection and order applied)."""
    if hasattr(dataset, "with_format"):
        return dataset.with_format("arrow")[name]
    return dataset[name]


def longest_first(lengths: list[int], count: int) -> list[int]:
    """The indices of the `count` longest samples, longest first (ties in data order)."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])[:count]


def longest_samples(dataset: Any, count: int, batch: int, known: Sequence[int] = ()) -> Any:
    """`count` samples drawn from the dataset's `batch` longest, so that every batch
    of a probe is a worst case whatever the sampler's order; the dataset unchanged
    when it does not expose its lengths. `known`: their indices, longest first, as the
    survey read them (enough of them: the lengths are not read again)."""
    if len(known) >= min(batch, _length(dataset) or 0) > 0:
        order = list(known[: max(1, batch)])
    else:
        lengths = sample_lengths(dataset)
        if not lengths:
            return dataset
        order = longest_first(lengths, max(1, batch))
    indices = [order[i % len(order)] for i in range(count)]
    if hasattr(dataset, "select"):
        return dataset.select(indices)
    from torch.utils.data import Subset

    return Subset(dataset, indices)
