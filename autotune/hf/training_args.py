"""TrainingArguments, in one place: the mapping from a candidate to the fields it sets,
the user's own arguments files (read, checked, merged), and validation.

A file may hold several dataclasses' fields (model, data and training arguments, as
the Hugging Face example scripts read with one HfArgumentParser). Keys TrainingArguments
does not know are kept as they are, unless one looks like a misspelt TrainingArguments
field, which is refused.

Only `checkpointing_field`, `training_fields`, `available_optimizers` and the
validators import transformers; the mapping itself is pure, so `show` and `export`
stay light.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import logging
import shlex
from pathlib import Path
from typing import Any

from autotune.core.checkpointing import Checkpointing
from autotune.core.enums import DeviceKind, Precision
from autotune.core.errors import AutotuneError, UsageError
from autotune.core.files import read_json
from autotune.core.job import BaseArguments
from autotune.core.levers import DECLARED
from autotune.core.optimizers import NOT_HERE, optimizer
from autotune.core.optimizers import PLAIN as PLAIN_OPTIMIZER
from autotune.core.precisions import FLAGS, MIXED_FLAGS, flags
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate
from autotune.hf.factory import import_class

# Deferred imports: transformers loads only when arguments are parsed or checked; `show` and
# `export` import this module without it

# `activation_checkpointing` in current transformers; `gradient_checkpointing` before.
CHECKPOINTING_FIELDS = ("activation_checkpointing", "gradient_checkpointing")


def tuned_arguments(
    candidate: Candidate,
    *,
    device_kind: DeviceKind,
    checkpointing_field: str = CHECKPOINTING_FIELDS[0],
    tf32_kept: bool = False,
    checkpointing_kwargs: dict[str, Any] | None = None,
    factory: bool = False,
) -> dict[str, Any]:
    """The TrainingArguments fields a candidate sets: what the probe runs and export writes.

    `tf32_kept`: the user's recipe turns TF32 on; under fp16 and bf16, where TF32 is not
    the precision searched but what the matmuls left in 32 bits use, theirs is kept.
    `checkpointing_kwargs`: the recipe's own, kept beside the level's (core/checkpointing.py).
    `factory`: the user's factory builds the Trainer with their arguments class, so a
    lever set through a field of that class (SFTConfig's padding-free switch) sets it."""
    precision_flags = flags(candidate.precision, tf32_kept=tf32_kept)
    args: dict[str, Any] = {
        "per_device_train_batch_size": candidate.per_device_train_batch_size,
        "gradient_accumulation_steps": candidate.gradient_accumulation_steps,
        **{k: v for k, v in precision_flags.items() if k != "tf32"},
        **candidate.activation_checkpointing.arguments(checkpointing_field, checkpointing_kwargs),
        "optim": candidate.optim,
        "train_sampling_strategy": candidate.train_sampling_strategy,
    }
    if device_kind == DeviceKind.CUDA:
        # Explicit either way, so "fp32" means full fp32 matmuls whatever torch's default.
        args["tf32"] = precision_flags["tf32"]
    else:
        args["use_cpu"] = True
    # The levers (core/levers.py), written only away from their plain values: a config
    # without them reads as it always did
    for lever, value in candidate.levers:
        args.update(lever.fields(value))
        if factory:
            args.update(lever.class_fields(value))
    return args


def study_arguments(spec: SearchSpec, candidate: Candidate) -> dict[str, Any]:
    """The tuned fields of a candidate on a study's device, under its transformers' names."""
    return tuned_arguments(
        candidate,
        device_kind=spec.device.kind,
        checkpointing_field=spec.checkpointing_field,
        tf32_kept=spec.recipe.tf32,
        checkpointing_kwargs=spec.recipe.checkpointing_kwargs(spec.checkpointing_field),
        factory=bool(spec.model.trainer),
    )


def recipe(spec: SearchSpec, candidate: Candidate) -> dict[str, Any]:
    """What a probe of the candidate runs and export writes: the base fields + tuned ones."""
    return merge(spec.base_arguments, study_arguments(spec, candidate))


def _tuned_fields() -> frozenset[str]:
    """Every field some candidate sets, on any device, under either checkpointing name,
    and those the levers own."""
    probe = Candidate(8, 1, Precision.FP32, Checkpointing.OFFLOAD, PLAIN_OPTIMIZER)
    return frozenset(
        key
        for kind in DeviceKind
        for field in CHECKPOINTING_FIELDS
        for key in tuned_arguments(probe, device_kind=kind, checkpointing_field=field)
    ) | {field for lever in DECLARED for field in lever.owns}


# Fields the search sets; a base file's values for them are replaced, not carried.
TUNED = _tuned_fields()


def checkpointing_field() -> str:
    """The installed transformers' name for activation checkpointing."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return next((n for n in CHECKPOINTING_FIELDS if n in names), CHECKPOINTING_FIELDS[-1])


def available_optimizers() -> tuple[str, ...]:
    """Every optimizer transformers names whose library is installed here."""
    from transformers.training_args import OptimizerNames

    names = []
    for name in (o.value for o in OptimizerNames):
        if name in NOT_HERE:
            continue
        module = optimizer(name).package
        if not module or importlib.util.find_spec(module) is not None:
            names.append(name)
    return tuple(names)


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


def arguments_class(dotted: str = "") -> Any:
    """The user's arguments class by its dotted name ("trl.SFTConfig"); "": the
    TrainingArguments a --model stand-in's probes run with."""
    if dotted:
        return import_class(dotted)
    from transformers import TrainingArguments

    return TrainingArguments


def training_fields(args_class: str = "") -> set[str]:
    """The init fields of the arguments class: what an arguments file may set."""
    return {f.name for f in dataclasses.fields(arguments_class(args_class)) if f.init}


def class_default(name: str, args_class: str = "") -> Any:
    """The arguments class's default for field `name`, as the installed transformers
    sets it (None where it has none): transformers 5 trains the fused AdamW by default
    from torch 2.8, torch's own before."""
    for field in dataclasses.fields(arguments_class(args_class)):
        if field.name == name:
            if field.default is not dataclasses.MISSING:
                return field.default
            if field.default_factory is not dataclasses.MISSING:
                return field.default_factory()
    return None


def read_json_object(path: Path, *, option: str) -> dict[str, Any]:
    """The file's JSON object; UsageError naming the option and the problem."""
    try:
        raw = read_json(path)
    except FileNotFoundError:
        raise UsageError(f"{option} {path}: no such file") from None
    except ValueError as exc:  # not UTF-8, not JSON, too deep, a number too long
        raise UsageError(f"{option} {path} is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{option} {path} must hold a JSON object of argument names to values")
    return raw


def read_arguments_file(path: Path, *, option: str, args_class: str = "") -> dict[str, Any]:
    """The file's JSON object, checked against the arguments class; UsageError naming the
    option and the problem."""
    raw = read_json_object(path, option=option)
    known = training_fields(args_class)
    name = args_class.rsplit(".", 1)[-1] or "TrainingArguments"
    for key in raw:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.85)
        if key not in known and close:
            raise UsageError(
                f"{option} {path}: {name} has no field {key!r} (did you mean "
                f"{close[0]!r}?); fix the name"
            )
    # Tuned fields are replaced anyway (and may name hardware this machine lacks).
    fields = {k: v for k, v in raw.items() if k in known and k not in TUNED}
    # in fp32: a class whose default precision this machine lacks (SFTConfig's bf16 on a
    # CPU) would refuse the file for a field the search sets anyway
    fields |= dict.fromkeys(MIXED_FLAGS, False)
    validate(fields, error=UsageError, where=f"{option} {path}", args_class=args_class)
    return raw


def base_arguments(
    raw: dict[str, Any], *, where: str = "--base-args", args_class: str = ""
) -> BaseArguments:
    """The global batch, the lengths and the carried fields of a user's arguments file."""
    known = training_fields(args_class)
    batch = _positive_int(raw, "per_device_train_batch_size", where)
    accumulation = _positive_int(raw, "gradient_accumulation_steps", where) or 1
    carried = {
        k: v
        for k, v in raw.items()
        if k in known and k not in TUNED and not k.startswith(PROBE_OWNED_PREFIXES)
    }
    return BaseArguments(
        process_batch_size=batch * accumulation if batch is not None else None,
        seq_len=next((_positive_int(raw, k, where) for k in SEQ_KEYS if k in raw), None),
        target_len=next((_positive_int(raw, k, where) for k in TARGET_KEYS if k in raw), None),
        carried=carried,
        kept={
            k: v
            for k, v in raw.items()
            if k in known and k not in TUNED and k.startswith(PROBE_OWNED_PREFIXES)
        },
        recipe={k: v for k, v in raw.items() if k in TUNED or k in CHECKPOINTING_FIELDS},
        # max_steps -1 is Trainer's "run the epochs": no step count to rank by
        train_steps=None
        if raw.get("max_steps", -1) == -1
        else _positive_int(raw, "max_steps", where),
    )


def _positive_int(raw: dict[str, Any], key: str, where: str) -> int | None:
    """raw[key] as a whole number >= 1 (None when absent); UsageError otherwise."""
    if key not in raw:
        return None
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{where}: {key} is {value!r}; it must be a whole number of at least 1")
    return value


def merge(user: dict[str, Any], tuned: dict[str, Any]) -> dict[str, Any]:
    """The user's arguments with only the tuned fields replaced (order kept).

    The one merge: the probe runs `merge(base, tuned)`, export writes it, and
    `export --merge-into` rewrites the user's file with it."""
    merged = dict(user)
    for key, value in tuned.items():
        merged[key] = value
    for name in CHECKPOINTING_FIELDS:  # the other name of the same switch would contradict
        if name not in tuned and any(n in tuned for n in CHECKPOINTING_FIELDS):
            merged.pop(name, None)
    return merged


def set_fields(args: Any) -> dict[str, Any]:
    """The fields of an arguments object that differ from its class's defaults, as JSON
    values: what the user set. Compared with an object of the class built with the same
    precision and device fields, so values derived in __post_init__ (accelerator_config,
    logging_dir) match; `*_token` fields, which to_dict masks, are left out."""
    same = {k: getattr(args, k) for k in ("output_dir", "use_cpu", *FLAGS)}
    defaults = type(args)(**same).to_dict()
    values = args.to_dict()
    init = {f.name for f in dataclasses.fields(args) if f.init}
    return {
        k: v
        for k, v in values.items()
        if k in init and not k.endswith("_token") and (k in same or v != defaults.get(k))
    }


# Fields that are strings to HfArgumentParser and turn on when given bare: `--fsdp True`
# reads as the deprecated option string "True", which the Trainer refuses
SWITCHES = ("fsdp",)


def cli_flags(tuned: dict[str, Any]) -> str:
    """The tuned fields as HfArgumentParser command-line flags."""
    parts = []
    for key, value in tuned.items():  # a dict (deepspeed) is one JSON word, quoted
        if key in SWITCHES and value is True:
            parts.append(f"--{key}")
            continue
        text = shlex.quote(json.dumps(value)) if isinstance(value, (dict, list)) else str(value)
        parts.append(f"--{key} {text}")
    return " ".join(parts)


# Fields TrainingArguments opens when they hold no dict. It opens a number (a bool too)
# as a file descriptor: 1 read and closed autotune's own stdout, 0 waited on stdin.
OPENED_FIELDS = ("accelerator_config", "deepspeed", "fsdp_config")


def validate(
    fields: dict[str, Any], *, error: type[AutotuneError], where: str, args_class: str = ""
) -> None:
    """Parse the fields the way the user's script will (HfArgumentParser, with their
    arguments class), and check that every value survives; raise `error` naming `where`
    and the first problem."""
    from transformers import HfArgumentParser
    from transformers.utils import logging as hf_logging

    cls = arguments_class(args_class)
    for key in OPENED_FIELDS:
        value = fields.get(key)
        if value is not None and not isinstance(value, (str, dict)):
            raise error(f"{where}: {key} is {value!r}; give the path of a JSON file or an object")
    parser = HfArgumentParser(cls)
    before = hf_logging.get_verbosity()
    # errors only: its warnings speak of this machine ("no Ampere GPU detected here" for
    # compiling), not of the file being checked
    hf_logging.set_verbosity(logging.ERROR)
    try:
        (parsed,) = parser.parse_dict(fields)
    except Exception as exc:  # its checks raise what they raise on a value of the wrong
        # type (AttributeError for metric_for_best_model [])
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise error(f"{where}: {cls.__name__} refuses it: {first}") from None
    finally:
        hf_logging.set_verbosity(before)
    for key, value in fields.items():
        if not _survived(value, getattr(parsed, key)):
            raise error(f"{where}: {key}={value!r} did not survive HfArgumentParser")


def _survived(value: Any, got: Any) -> bool:
    """The parsed field holds what the file said (an enum as its name; report_to's
    "none" as [], "wandb" as ["wandb"])."""
    if got == value or str(got) == str(value):
        return True
    if isinstance(got, list) and isinstance(value, str):
        return got == ([] if value == "none" else [v.strip() for v in value.split(",")])
    return False
