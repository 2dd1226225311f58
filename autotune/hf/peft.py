"""A LoRA adapter for the --model stand-in: `--lora r=16,alpha=32,targets=q_proj,v_proj`
or `--peft-config adapter_config.json` (the file PEFT's save_pretrained writes), read
into the LoraConfig fields `hf/models.with_adapter` wraps the built model with."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.core.errors import UsageError
from autotune.hf.training_args import read_json_object

# Deferred imports: peft loads only when an adapter is checked; the planner imports this module
# for every search

# --lora's short names for LoraConfig's fields
_NAMES = {
    "r": "r",
    "alpha": "lora_alpha",
    "dropout": "lora_dropout",
    "targets": "target_modules",
    "bias": "bias",
}
_FILE_KEYS = ("r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora")


def adapter_settings(lora: str | None, peft_config: Path | None) -> dict[str, Any]:
    """The LoraConfig fields --lora or --peft-config ask for; UsageError when malformed or
    when peft is not installed."""
    if lora and peft_config:
        raise UsageError("--lora and --peft-config both describe the adapter: give one")
    if importlib.util.find_spec("peft") is None:
        raise UsageError(
            "--lora needs peft, which is not installed: pip install 'trainer-autotune[peft]'"
        )
    settings = parse_lora(lora) if lora else _read_file(peft_config)
    settings = {"peft_type": "LORA", **settings}
    _check(settings, f"--lora {lora}" if lora else f"--peft-config {peft_config}")
    return settings


def parse_lora(text: str) -> dict[str, Any]:
    """`r=16,alpha=32,targets=q_proj,v_proj`: a value without `=` continues the list
    before it (targets=q_proj,v_proj)."""
    settings: dict[str, Any] = {}
    last = ""
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, equals, value = item.partition("=")
        if not equals:
            if last != "target_modules":
                raise UsageError(f"--lora {text}: {item!r} is not NAME=VALUE")
            settings[last].append(item)
            continue
        name = _NAMES.get(key.strip())
        if name is None:
            raise UsageError(
                f"--lora {text}: unknown setting {key!r}; use {', '.join(_NAMES)} "
                "(or --peft-config FILE for any other)"
            )
        settings[name] = _value(name, value.strip(), text)
        last = name
    if "target_modules" not in settings:
        raise UsageError(
            f"--lora {text}: name the layers to adapt, e.g. targets=q_proj,v_proj "
            "(or targets=all-linear)"
        )
    return settings


def _value(name: str, value: str, text: str) -> Any:
    try:
        if name == "r" or name == "lora_alpha":
            return int(value)
        if name == "lora_dropout":
            return float(value)
    except ValueError:
        raise UsageError(f"--lora {text}: {name} must be a number, not {value!r}") from None
    if name == "target_modules":
        return value if value == "all-linear" else [value]
    return value


def _read_file(path: Path | None) -> dict[str, Any]:
    if path is None:
        raise UsageError("give --lora SETTINGS or --peft-config FILE")
    raw = read_json_object(path, option="--peft-config")
    if raw.get("peft_type", "LORA") != "LORA":
        raise UsageError(f"--peft-config {path}: give a LoRA adapter_config.json")
    settings = {k: raw[k] for k in _FILE_KEYS if raw.get(k) is not None}
    for key, value in settings.items():  # LoraConfig takes any type; the model would not
        takes, what = _FILE_TYPES[key]
        if not takes(value):
            raise UsageError(f"--peft-config {path}: {key} is {value!r}; it must be {what}")
    return settings


def _number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)


_FILE_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "r": (lambda v: _number(v) and isinstance(v, int), "a whole number"),
    "lora_alpha": (_number, "a number"),
    "lora_dropout": (lambda v: _number(v) and 0 <= v < 1, "a number from 0 up to 1"),
    "target_modules": (
        lambda v: (
            isinstance(v, str) or (isinstance(v, list) and all(isinstance(m, str) for m in v))
        ),
        "a layer name or a list of them",
    ),
    "bias": (lambda v: isinstance(v, str), 'one of "none", "all", "lora_only"'),
    "use_rslora": (lambda v: isinstance(v, bool), "true or false"),
}


def _check(settings: dict[str, Any], where: str) -> None:
    """LoraConfig itself accepts the settings (its own checks, e.g. r > 0)."""
    from peft import LoraConfig

    try:
        LoraConfig(**{k: v for k, v in settings.items() if k != "peft_type"})
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}: peft refuses it: {exc}") from None
    if int(settings.get("r", 8)) < 1:
        raise UsageError(f"{where}: r must be at least 1")
