"""Reading a built Trainer: what its model trains (PEFT adapters, a quantized base),
and its train dataset's lengths, so that probes can measure on the longest samples."""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.core.job import JobFacts
from autotune.hf.factory import class_name
from autotune.hf.models import detect_task, parameter_count


def job_facts(trainer: Any) -> JobFacts:
    """What the factory built, read off the Trainer it returned."""
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
        quantized=quantization(base),
        longest=max(lengths) if lengths else None,
        per_device_train_batch_size=int(args.per_device_train_batch_size),
        gradient_accumulation_steps=int(args.gradient_accumulation_steps),
        max_length=int(length) if isinstance(length, int) else None,
        parameters=counted.total,
        trainable=counted.trainable or counted.total,
        embedding=counted.embedding,
        largest=counted.largest,
    )


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


def quantization(model: Any) -> str:
    """How the base weights were loaded, when quantized: "4-bit (bitsandbytes)"."""
    for bits in (4, 8):
        if getattr(model, f"is_loaded_in_{bits}bit", False):
            return f"{bits}-bit (bitsandbytes)"
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        method = getattr(quantizer.quantization_config, "quant_method", "")
        return str(getattr(method, "value", method) or type(quantizer).__name__)
    return ""


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:  # an iterable dataset
        return None


def sample_lengths(dataset: Any) -> list[int] | None:
    """Tokens in each sample, from a `length` or `input_ids` column (a datasets.Dataset)
    or item; None when the dataset does not expose them."""
    if dataset is None or _length(dataset) is None:
        return None
    columns = getattr(dataset, "column_names", None)
    if columns is not None:
        if "length" in columns:
            return [int(n) for n in dataset["length"]]
        if "input_ids" in columns:
            return [len(ids) for ids in dataset["input_ids"]]
        return None
    try:
        return [len(dataset[i]["input_ids"]) for i in range(len(dataset))]
    except (KeyError, TypeError, IndexError):
        return None


def longest_samples(dataset: Any, count: int, batch: int) -> Any:
    """`count` samples drawn from the dataset's `batch` longest, so that every batch
    of a probe is a worst case whatever the sampler's order; the dataset unchanged
    when it does not expose its lengths."""
    lengths = sample_lengths(dataset)
    if not lengths:
        return dataset
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])[: max(1, batch)]
    indices = [order[i % len(order)] for i in range(count)]
    if hasattr(dataset, "select"):
        return dataset.select(indices)
    from torch.utils.data import Subset

    return Subset(dataset, indices)
