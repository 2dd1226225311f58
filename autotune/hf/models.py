"""Resolve --model to an architecture, detect its task, and build it with random weights.

Probing needs the architecture, not the weights. We look in three places, in order:
a local directory (or config.json file), the Hugging Face cache or hub, and the
architecture presets bundled in `autotune/presets/`.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from autotune.core.enums import Task
from autotune.core.errors import ModelConfigError, ModelNotFoundError, UsageError
from autotune.core.files import read_json
from autotune.core.job import ParameterCount
from autotune.core.trial import ModelSpec

# Deferred imports: transformers, torch, peft and the hub's client load only when a model is
# resolved, counted or built; `show` and `export` import this module without them

TASKS = tuple(Task)
PRESET_DIR = Path(__file__).parents[1] / "presets"

_ARCH_SUFFIXES = (
    ("ForConditionalGeneration", Task.SEQ2SEQ),
    ("ForSeq2SeqLM", Task.SEQ2SEQ),
    ("ForCausalLM", Task.CAUSAL_LM),
    ("LMHeadModel", Task.CAUSAL_LM),
    ("ForMaskedLM", Task.MASKED_LM),
    ("ForPreTraining", Task.MASKED_LM),
    ("ForSequenceClassification", Task.CLASSIFICATION),
)


def preset_names() -> list[str]:
    return sorted(p.stem.replace("__", "/") for p in PRESET_DIR.glob("*.json"))


def resolve_model(name: str, *, task: str = "auto") -> ModelSpec:
    """Find the model's config: local path, then HF cache/hub, then bundled preset."""
    if task != "auto" and task not in TASKS:
        raise UsageError(f"--task {task!r} is not one of auto, {', '.join(TASKS)}")
    path = Path(name).expanduser()
    if path.exists() or name.startswith((".", "/", "~")):
        config, source = _load_local(path, name), "local"
    else:
        found = _load_from_hf(name) or _load_preset(name)
        if found is None:
            raise ModelNotFoundError(
                f"model {name!r} not found: no local directory with config.json, not in the "
                f"Hugging Face cache or hub{_hub_state()}, and not a bundled preset "
                f"({', '.join(preset_names())}); pass a directory that holds config.json"
            )
        config, source = found
    _check_buildable(name, config)
    detected = detect_task(config) if task == "auto" else task
    if detected is None:
        raise ModelConfigError(
            f"cannot tell the task of {name!r} from its config (architectures: "
            f"{config.get('architectures')}); pass --task {'|'.join(TASKS)}"
        )
    return ModelSpec(name=name, source=source, task=Task(detected), config=config)


def detect_task(config: dict[str, Any]) -> str | None:
    """The training task a config was published for, or None when it does not say."""
    archs = config.get("architectures")
    for arch in archs if isinstance(archs, list) else []:  # a config may say anything
        for suffix, task in _ARCH_SUFFIXES:
            if str(arch).endswith(suffix):
                return task
    if config.get("is_encoder_decoder"):
        return Task.SEQ2SEQ
    from transformers.models.auto import modeling_auto as auto

    model_type = config.get("model_type")
    if model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return Task.CAUSAL_LM
    if model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return Task.MASKED_LM
    return None


def build_model(spec: ModelSpec, **model_arguments: Any) -> Any:
    """The model with random weights, for the spec's task (in the child); with the
    candidate's model arguments (Candidate.model_arguments: the attention kernel)."""
    config = transformers_config(spec.config)
    if spec.task == Task.CLASSIFICATION and "num_labels" not in spec.config:
        config.num_labels = 2
    model = auto_class(spec.task).from_config(config, **model_arguments)
    return with_adapter(model, spec) if spec.adapter else model


# PEFT's task type for each task a LoRA stand-in can have
_PEFT_TASKS = {
    Task.SEQ2SEQ: "SEQ_2_SEQ_LM",
    Task.CAUSAL_LM: "CAUSAL_LM",
    Task.CLASSIFICATION: "SEQ_CLS",
    Task.MASKED_LM: "FEATURE_EXTRACTION",
}


def with_adapter(model: Any, spec: ModelSpec) -> Any:
    """The model wrapped in the spec's LoRA adapter (--lora, --peft-config): its base
    frozen, the adapter's weights trainable, as `peft.get_peft_model` does in a script."""
    from peft import LoraConfig, get_peft_model

    settings = {k: v for k, v in spec.adapter.items() if k != "peft_type"}
    settings.setdefault("task_type", _PEFT_TASKS[spec.task])
    return get_peft_model(model, LoraConfig(**settings))


def auto_class(task: Task) -> Any:
    """The transformers Auto class that builds a model for this task."""
    import transformers

    return {
        Task.SEQ2SEQ: transformers.AutoModelForSeq2SeqLM,
        Task.CAUSAL_LM: transformers.AutoModelForCausalLM,
        Task.MASKED_LM: transformers.AutoModelForMaskedLM,
        Task.CLASSIFICATION: transformers.AutoModelForSequenceClassification,
    }[task]


def count_parameters(spec: ModelSpec) -> ParameterCount:
    """Parameters of the model, built on the meta device (no memory, no weights); a
    --lora adapter whose targets the model lacks is the user's error, said in one line."""
    import torch

    try:
        with torch.device("meta"):
            model = build_model(spec)
    except Exception as exc:  # what a config's values make building the model raise
        if spec.adapter and isinstance(exc, ValueError):  # peft: a target the model lacks
            first = str(exc).strip().splitlines()[0]
            raise UsageError(
                f"--lora: {first}; targets= must name layers {spec.name} has"
            ) from None
        raise ModelConfigError(
            f"transformers cannot build {spec.name!r} from its config: {_said(exc)}"
        ) from None
    return parameter_count(model)


def parameter_count(model: Any) -> ParameterCount:
    """Every parameter (tied ones once), those in embeddings, the largest tensor, and
    those that train when not all do (a LoRA adapter's)."""
    import torch

    embedding = {
        id(p): p.numel()
        for module in model.modules()
        if isinstance(module, torch.nn.Embedding)
        for p in module.parameters()
    }
    parameters = list(model.parameters())
    sizes = [parameter_elements(p) for p in parameters]
    trainable = sum(n for n, p in zip(sizes, parameters, strict=True) if p.requires_grad)
    partial = trainable < sum(sizes)
    frozen = sum(held_bytes(p) for p in parameters if not p.requires_grad)
    return ParameterCount(
        int(sum(sizes)),
        int(sum(embedding.values())),
        int(max(sizes, default=0)),
        trainable=int(trainable) if partial else 0,
        frozen_bytes=frozen if partial else 0,
        checkpoint_layers=checkpoint_layers(model),
    )


def checkpoint_layers(model: Any) -> int | None:
    """The layers `every_n_layers` counts (transformers' GradientCheckpointingLayer
    modules, in order); None where the installed transformers has no every_n_layers."""
    from transformers import PreTrainedModel

    enable = getattr(PreTrainedModel, "activation_checkpointing_enable", None)
    if enable is None or "every_n_layers" not in inspect.signature(enable).parameters:
        return None
    from transformers.modeling_layers import GradientCheckpointingLayer

    return sum(1 for m in model.modules() if isinstance(m, GradientCheckpointingLayer))


def held_bytes(parameter: Any) -> int:
    """The bytes a parameter takes as it is held: its storage (a 4-bit tensor packs two
    weights a byte) and a quantized tensor's scales (bitsandbytes' absmax, and the
    second level's when the scales are themselves quantized)."""
    size = int(parameter.numel()) * int(parameter.element_size())
    state = getattr(parameter, "quant_state", None)
    while state is not None:
        absmax = getattr(state, "absmax", None)
        if absmax is not None:
            size += int(absmax.numel()) * int(absmax.element_size())
        state = getattr(state, "state2", None)
    scb = getattr(parameter, "SCB", None)  # LLM.int8(): a scale a row
    if scb is not None:
        size += int(scb.numel()) * int(scb.element_size())
    return size


def parameter_elements(parameter: Any) -> int:
    """A parameter's weights: a 4-bit bitsandbytes tensor packs two in each byte."""
    quant = getattr(parameter, "quant_state", None)
    if quant is not None and getattr(quant, "shape", None) is not None:
        count = 1
        for size in quant.shape:
            count *= int(size)
        return count
    return int(parameter.numel())


def max_positions(config: dict[str, Any]) -> int | None:
    """The longest sequence the architecture accepts, when it has a limit."""
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return None


def _load_local(path: Path, name: str) -> dict[str, Any]:
    config_path = path / "config.json" if path.is_dir() else path
    if not path.exists():
        raise ModelNotFoundError(f"model path {name!r} does not exist")
    if not config_path.is_file():
        raise ModelConfigError(
            f"{name!r} has no config.json; pass a model directory saved with "
            "save_pretrained, or a hub id"
        )
    try:
        config = read_json(config_path)
    except ValueError as exc:  # not UTF-8, not JSON, too deep, a number too long
        raise ModelConfigError(
            f"{config_path} is not valid JSON ({exc}); fix or regenerate it"
        ) from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelConfigError(
            f"{config_path} has no 'model_type'; it is not a transformers model config"
        )
    return config


def _load_from_hf(name: str) -> tuple[dict[str, Any], str] | None:
    """The config from the local HF cache, else the hub when it can be reached quickly."""
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a valid repo id
        return None
    if isinstance(cached, str):
        return json.loads(Path(cached).read_text(encoding="utf-8")), "cache"
    if _hub_offline() or not _hub_reachable():
        return None
    try:
        downloaded = hf_hub_download(name, "config.json", etag_timeout=5)
    except Exception:  # not found, gated, network trouble: all mean "not here"
        return None
    return json.loads(Path(downloaded).read_text(encoding="utf-8")), "hub"


def _load_preset(name: str) -> tuple[dict[str, Any], str] | None:
    preset = PRESET_DIR / (name.replace("/", "__") + ".json")
    if not preset.is_file():
        return None
    return json.loads(preset.read_text(encoding="utf-8")), "preset"


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _hub_reachable(timeout_s: float = 2.0) -> bool:
    """A quick TCP check, so an offline machine does not wait ~25 s for hub retries."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((endpoint.hostname or "", endpoint.port or 443), timeout_s):
            return True
    except OSError:
        return False


def _hub_state() -> str:
    return " (HF_HUB_OFFLINE is set)" if _hub_offline() else " (unreachable or not there)"


def transformers_config(config: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    values = dict(config)
    model_type = values.pop("model_type")
    return AutoConfig.for_model(model_type, **values)


# Building a model on the meta device costs no memory, but a loop per layer (or expert):
# a config saying 2**63 of them would hang the search, not fail it
MAX_LAYERS = 10_000


def _check_buildable(name: str, config: dict[str, Any]) -> None:
    for key, value in config.items():
        many = isinstance(value, int) and not isinstance(value, bool) and value > MAX_LAYERS
        if many and ("layer" in key or "experts" in key):
            raise ModelConfigError(
                f"{name!r}: its config's {key} is {value}, more than the {MAX_LAYERS} a model "
                "built here may have; fix config.json"
            )
    try:
        transformers_config(config)
    except Exception as exc:  # the config's checks raise their own types
        raise ModelConfigError(
            f"transformers cannot build {name!r} from its config: {_said(exc)}"
        ) from None


def _said(exc: Exception) -> str:
    """An exception's message on one line (huggingface_hub's validation errors take two)."""
    return " ".join(str(exc).split())[:300] or type(exc).__name__
