"""The user's own arguments files: read and check them, merge tuned fields in, print flags.

A file may hold several dataclasses' fields (model, data and training arguments, as
the Hugging Face example scripts read with one HfArgumentParser). Keys TrainingArguments
does not know are kept as they are, unless one looks like a misspelt TrainingArguments
field, which is refused.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path
from typing import Any

from autotune.core.errors import UsageError

# Fields the search sets; a base file's values for them are replaced, not carried.
TUNED = {
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "fp16",
    "bf16",
    "tf32",
    "activation_checkpointing",
    "gradient_checkpointing",
    "optim",
    "use_cpu",
}
# Fields the probe owns (run length, bookkeeping, evaluation): never carried into a probe.
PROBE_OWNED_PREFIXES = (
    "output_dir",
    "logging_",
    "save_",
    "eval",
    "push_to_hub",
    "hub_",
    "report_to",
    "run_name",
    "resume_from_checkpoint",
    "max_steps",
    "num_train_epochs",
    "load_best_model_at_end",
    "metric_for_best_model",
    "do_",
    "disable_tqdm",
    "overwrite_output_dir",
)
SEQ_KEYS = ("max_seq_length", "max_source_length", "block_size", "max_length")
TARGET_KEYS = ("max_target_length",)


@dataclasses.dataclass(frozen=True)
class BaseArguments:
    """What a search takes from the user's existing arguments file."""

    global_batch_size: int | None
    seq_len: int | None
    target_len: int | None
    carried: dict[str, Any]  # their other TrainingArguments fields, run in every probe


def training_fields() -> set[str]:
    from transformers import TrainingArguments

    return {f.name for f in dataclasses.fields(TrainingArguments) if f.init}


def read_arguments_file(path: Path, *, option: str) -> dict[str, Any]:
    """The file's JSON object, checked; UsageError naming the option and the problem."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{option} {path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{option} {path} is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{option} {path} must hold a JSON object of argument names to values")
    known = training_fields()
    for key in raw:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.85)
        if key not in known and close:
            raise UsageError(
                f"{option} {path}: TrainingArguments has no field {key!r} (did you mean "
                f"{close[0]!r}?); fix the name"
            )
    # Tuned fields are replaced anyway (and may name hardware this machine lacks).
    _check_values({k: v for k, v in raw.items() if k in known and k not in TUNED}, path, option)
    return raw


def base_arguments(raw: dict[str, Any]) -> BaseArguments:
    known = training_fields()
    batch = raw.get("per_device_train_batch_size")
    accumulation = raw.get("gradient_accumulation_steps", 1)
    carried = {
        k: v
        for k, v in raw.items()
        if k in known and k not in TUNED and not k.startswith(PROBE_OWNED_PREFIXES)
    }
    return BaseArguments(
        global_batch_size=int(batch) * int(accumulation) if batch is not None else None,
        seq_len=next((int(raw[k]) for k in SEQ_KEYS if k in raw), None),
        target_len=next((int(raw[k]) for k in TARGET_KEYS if k in raw), None),
        carried=carried,
    )


def merge(user: dict[str, Any], tuned: dict[str, Any]) -> dict[str, Any]:
    """The user's arguments with only the tuned fields replaced (order kept)."""
    merged = dict(user)
    for key, value in tuned.items():
        merged[key] = value
    if "activation_checkpointing" in tuned:
        merged.pop("gradient_checkpointing", None)  # the deprecated alias would contradict
    return merged


def cli_flags(tuned: dict[str, Any]) -> str:
    """The tuned fields as HfArgumentParser command-line flags."""
    parts = []
    for key, value in tuned.items():
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        parts.append(f"--{key} {text}")
    return " ".join(parts)


def _check_values(fields: dict[str, Any], path: Path, option: str) -> None:
    from transformers import HfArgumentParser, TrainingArguments

    parser = HfArgumentParser(TrainingArguments)  # type: ignore[arg-type]
    try:
        parser.parse_dict(fields)
    except (ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"{option} {path}: TrainingArguments refuses it: {first}") from None
