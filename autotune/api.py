"""autotune from Python: `autotune.search(...)` runs the search `autotune search` runs,
down the same path (`search_command`), and `autotune.load(...)` reads a study's tuned
arguments back in a training script."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.commands import best_of_study, resolve_storage
from autotune.core.enums import Objective
from autotune.core.errors import UsageError
from autotune.core.units import parse_duration, parse_size
from autotune.hf.factory import class_name, reference_of
from autotune.hf.training_args import set_fields
from autotune.search_command import search_command
from autotune.tuning.options import SearchOptions
from autotune.tuning.outcome import SearchOutcome
from autotune.views.export import exported_arguments

_LISTS = ("precisions", "optimizers", "checkpointing", "levers", "devices")
_PATHS = ("base_args", "output")


def search(
    job: str | Callable[..., Any],
    *,
    base_args: str | Path | dict[str, Any] | Any = None,
    memory_budget: int | str | None = None,
    time_budget: float | str | None = None,
    studies_dir: str | Path = "studies",
    **options: Any,
) -> SearchOutcome:
    """Search the fastest config of your job that fits, and export it, as `autotune search`.

    Args:
        job: your Trainer factory, a function `make_trainer(args) -> Trainer` defined at
            the top level of a module, a script or a notebook cell (each probe loads it
            again and calls it with the candidate's arguments: a script's by importing
            it, so keep the call to `autotune.search` under `if __name__ == "__main__":`;
            a notebook's is pickled by value with what it uses, into
            `studies/factories/`); or "FILE.py:FUNCTION"; or a model name (a local
            folder holding config.json, a hub id, a bundled preset) to tune a stand-in
            built from its config.
        base_args: your arguments: a JSON file, a dict, or the arguments object itself
            (a `TrainingArguments`, `SFTConfig`, ...); the global batch, the lengths and
            every field not tuned come from it.
        memory_budget: what one training process may use: bytes, or "16GiB", "7500MB".
        time_budget: the whole search: seconds, or "10m", "1h30m" (default 30 minutes).
            It plans the search too: the timed steps a probe, whether torch.compile is
            probed, and the parity runs' length (as the CLI's first lines say).
        studies_dir: where studies, trial folders and exports go.
        **options: any other field of `autotune.tuning.options.SearchOptions`, named as
            the CLI's flag without its dashes (global_batch_size=64, seq_len=1024,
            precisions=["fp32", "bf16"], parity="quick", lora="r=16,targets=q_proj").

    Returns the `SearchOutcome`: the exported record, the export's path, what changed
    against your recipe with its parity verdict, the speed over the plain default, and
    `arguments()`, the tuned arguments in your class. Raises
    `autotune.core.errors.AutotuneError` (a `UsageError` for bad input) with the
    one-line message the CLI prints.
    """
    options = _normalised(job, options, Path(studies_dir))
    with tempfile.TemporaryDirectory(prefix="autotune-base-args-") as scratch:
        asked = SearchOptions(
            base_args=_base_args_file(base_args, Path(scratch), options),
            memory_budget=_parsed(memory_budget, parse_size, "memory_budget"),
            time_budget=_parsed(time_budget, parse_duration, "time_budget"),
            **options,
        )
        return search_command(asked, studies_dir=Path(studies_dir))


def _normalised(
    job: str | Callable[..., Any], options: dict[str, Any], studies_dir: Path
) -> dict[str, Any]:
    """The keyword options as SearchOptions' fields: lists as tuples, paths as Paths, the
    job as --trainer (a function, "FILE.py:FUNCTION") or --model (a name); a function
    defined in a notebook is pickled under `studies_dir`."""
    fields = {f.name for f in dataclasses.fields(SearchOptions)}
    unknown = sorted(set(options) - fields | ({"model", "trainer"} & set(options)))
    if unknown:
        raise UsageError(
            f"autotune.search() has no option {', '.join(unknown)}; the job is the first "
            "argument, the options the fields of autotune.tuning.options.SearchOptions"
        )
    for name in _LISTS:
        if isinstance(value := options.get(name), str):
            options[name] = tuple(v.strip() for v in value.split(",") if v.strip())
        elif value is not None:
            options[name] = tuple(value)
    for name in _PATHS:
        if options.get(name) is not None:
            options[name] = Path(options[name])
    if "objective" in options:
        options["objective"] = Objective(options["objective"])
    if callable(job):
        options["trainer"] = reference_of(job, studies_dir)
    elif ":" in job and not Path(job).exists():  # FILE.py:FUNCTION, package.module:FUNCTION
        options["trainer"] = job
    else:
        options["model"] = job
    return options


def _base_args_file(given: Any, scratch: Path, options: dict[str, Any]) -> Path | None:
    """Your arguments as the file a search reads: a path as it is; a dict or an
    arguments object written to `scratch` (an object's class becomes --args-class)."""
    if given is None or isinstance(given, (str, Path)):
        return Path(given) if given is not None else None
    if not isinstance(given, dict):
        if not dataclasses.is_dataclass(given) or not hasattr(given, "to_dict"):
            raise UsageError(
                f"base_args={type(given).__name__}: give a JSON file, a dict, or your "
                "TrainingArguments (SFTConfig, ...) object"
            )
        options.setdefault("args_class", class_name(type(given)))
        given = set_fields(given)
    path = scratch / "base_args.json"
    path.write_text(json.dumps(given, indent=2, default=str), encoding="utf-8")
    return path


def load(
    study: str,
    *,
    storage: str | None = None,
    studies_dir: str | Path = "studies",
    objective: str | None = None,
) -> dict[str, Any]:
    """The arguments of a study's best config (your --base-args fields with the tuned
    ones in place), as the export writes them: `SFTConfig(**autotune.load("my-job"))`.
    The best by the objective the study was searched for, unless `objective` names the
    other ("throughput": the fastest that fits; "efficiency": samples/s per GiB)."""
    url = resolve_storage(storage, Path(studies_dir))
    goal = _parsed(objective, Objective, "objective") if objective else None
    best, spec, _ = best_of_study(study_name=study, storage=url, objective=goal)
    return exported_arguments(spec, best)


def _parsed(value: Any, parse: Any, name: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return parse(value)
    except ValueError as exc:
        raise UsageError(f"{name}={value!r}: {exc}") from None
