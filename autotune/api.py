"""autotune from Python: `autotune.search(...)` runs the search `autotune search` runs,
down the same path (`search_command`), and `autotune.load(...)` reads a study's tuned
arguments back in a training script."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from autotune.commands import best_of_study, resolve_storage
from autotune.core.enums import Objective
from autotune.core.errors import UsageError
from autotune.core.units import parse_duration, parse_size
from autotune.hf.training_args import study_arguments
from autotune.search_command import search_command
from autotune.tuning.options import SearchOptions
from autotune.tuning.outcome import SearchOutcome

_LISTS = ("precisions", "optimizers", "checkpointing", "levers", "devices")
_PATHS = ("base_args", "output")


def search(
    model: str,
    *,
    memory_budget: int | str | None = None,
    time_budget: float | str | None = None,
    studies_dir: str | Path = "studies",
    **options: Any,
) -> SearchOutcome:
    """Search the fastest config of `model` that fits and export it, as `autotune search`.

    Args:
        model: a local folder holding config.json, a hub id, or a bundled preset.
        memory_budget: what one training process may use: bytes, or "16GiB", "7500MB".
        time_budget: the whole search: seconds, or "10m", "1h30m" (default 30 minutes).
        studies_dir: where studies, trial folders and exports go.
        **options: any other field of `autotune.tuning.options.SearchOptions`, named as
            the CLI's flag without its dashes (global_batch_size=64, seq_len=1024,
            base_args="my_args.json", precisions=["fp32", "bf16"], parity="quick").

    Returns the `SearchOutcome`: the exported record, the export's path, what changed
    against your recipe with its parity verdict, and the speed over the plain default.
    Raises `autotune.core.errors.AutotuneError` (a `UsageError` for bad input) with the
    one-line message the CLI prints.
    """
    fields = {f.name for f in dataclasses.fields(SearchOptions)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise UsageError(
            f"autotune.search() has no option {', '.join(unknown)}; the options are the "
            "fields of autotune.tuning.options.SearchOptions"
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
    asked = SearchOptions(
        model=model,
        memory_budget=_parsed(memory_budget, parse_size, "memory_budget"),
        time_budget=_parsed(time_budget, parse_duration, "time_budget"),
        **options,
    )
    return search_command(asked, studies_dir=Path(studies_dir))


def load(
    study: str, *, storage: str | None = None, studies_dir: str | Path = "studies"
) -> dict[str, Any]:
    """The tuned TrainingArguments fields of a study's best config (your --base-args
    fields with the tuned ones in place), as the export writes them:
    `TrainingArguments(**autotune.load("mt5-small"))`."""
    url = resolve_storage(storage, Path(studies_dir))
    best, spec, _ = best_of_study(study_name=study, storage=url, objective=Objective.THROUGHPUT)
    return study_arguments(spec, best.candidate)


def _parsed(value: Any, parse: Any, name: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return parse(value)
    except ValueError as exc:
        raise UsageError(f"{name}={value!r}: {exc}") from None
