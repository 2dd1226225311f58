"""autotune from Python: `autotune.search(...)` runs the search `autotune search` runs,
down the same path (`search_command`), and `autotune.load(...)` reads a study's tuned
arguments back in a training script.

`search` takes the search command's flags as keywords, derived from their one click
declaration (`cli_types.SEARCH_OPTIONS`): `--seq-len` is `seq_len=`, `--no-rehearse` is
`no_rehearse=True`, each value checked by the flag's own type. `options_table()` is
docs/api.md's table of them (`python -m autotune.api` prints it)."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import click

from autotune.cli_types import ListType, ParsedType, search_options
from autotune.commands import best_of_study, resolve_storage
from autotune.core.enums import Objective
from autotune.core.errors import UsageError
from autotune.hf.factory import class_name, reference_of
from autotune.hf.training_args import set_fields
from autotune.search_command import search_command
from autotune.tuning.options import SearchOptions
from autotune.tuning.outcome import SearchOutcome
from autotune.views.export import exported_arguments

_JOB = 'the job is the first argument (a function, "FILE.py:FUNCTION" or a model name)'
_PRINTED = "it chooses how the CLI prints the outcome, which autotune.search() returns"
# Keywords of flags that have no meaning from Python, and why
_NOT_FROM_PYTHON = {
    "trainer": _JOB,
    "model": _JOB,
    "format": _PRINTED,
    "fmt": _PRINTED,
    "debug": "it shows the CLI's tracebacks; from Python an error is an exception with its own",
}
# How a value given from Python reads, for the flags parsed by autotune's own types
_PARSED = {
    "SIZE": 'int (bytes) or str (`"16GiB"`)',
    "DURATION": 'float (seconds) or str (`"10m"`)',
    "FRACTION": "float",
}


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
            built from its config. It takes the place of --trainer and --model.
        base_args: your arguments: a JSON file, a dict, or the arguments object itself
            (a `TrainingArguments`, `SFTConfig`, ...); the global batch, the lengths and
            every field not tuned come from it.
        memory_budget: what one training process may use: bytes, or "16GiB", "7500MB".
        time_budget: the whole search: seconds, or "10m", "1h30m" (default 30 minutes).
            It plans the search too: the timed steps a probe, whether torch.compile is
            probed, and the parity runs' length (as the CLI's first lines say).
        studies_dir: where studies, trial folders and exports go.
        **options: any other flag of `autotune search`, its dashes as underscores
            (global_batch_size=64, precisions=["fp32", "bf16"], parity="quick",
            lever=["NAME=VALUE"], no_rehearse=True; `options_table()` lists
            them). A list is a list or a comma-separated str; None is the default.
            `study_name=` and `levers=`, the fields behind --study and --lever, work too.

    Returns the `SearchOutcome`: the exported record, the export's path, what changed
    against your recipe with its parity verdict, the speed over the plain default, and
    `arguments()`, the tuned arguments in your class. Raises
    `autotune.core.errors.AutotuneError` (a `UsageError` for bad input) with the
    one-line message the CLI prints.
    """
    given = {"memory_budget": memory_budget, "time_budget": time_budget, **options}
    fields = _normalised(job, given, Path(studies_dir))
    with tempfile.TemporaryDirectory(prefix="autotune-base-args-") as scratch:
        base = _base_args_file(base_args, Path(scratch), fields)
        asked = SearchOptions(base_args=base, **fields)
        return search_command(asked, studies_dir=Path(studies_dir))


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


class Keyword(NamedTuple):
    """A keyword of `autotune.search`: the flag it stands for, whether it negates it
    (`no_rehearse=True` is `rehearse=False`), and whether it is a flag's name (else the
    field's, kept where the flag's differs: `study_name` for --study)."""

    param: click.Option
    negated: bool = False
    flag: bool = True


@functools.cache
def _search_flags() -> tuple[click.Option, ...]:
    """The search command's options, from the declaration `autotune search` is built of
    (cli_types; the api and the cli are independent layers), less those of the CLI only."""
    command = click.command("search")(search_options(lambda **_: None))
    found = (p for p in command.params if isinstance(p, click.Option))
    return tuple(p for p in found if _keyword(p.opts[0]) not in _NOT_FROM_PYTHON)


@functools.cache
def keywords() -> dict[str, Keyword]:
    """`autotune.search`'s option keywords: every name of every search flag, its dashes as
    underscores (--no-X: negated), then each flag's field where no flag has its name.

    The fields' names stay accepted, rather than refused for the flag's: they are what
    `search` took and documented before (`study_name=`, `levers=`), a field names one
    flag without doubt, and refusing would break working code for a rename."""
    found: dict[str, Keyword] = {}
    for param in _search_flags():
        found.update({_keyword(flag): Keyword(param) for flag in param.opts})
        found.update({_keyword(flag): Keyword(param, True) for flag in param.secondary_opts})
    for param in _search_flags():
        found.setdefault(str(param.name), Keyword(param, flag=False))
    return found


def _keyword(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _normalised(
    job: str | Callable[..., Any], given: dict[str, Any], studies_dir: Path
) -> dict[str, Any]:
    """The keyword options as SearchOptions' fields, each checked and converted by its
    flag's type as the CLI's is (None: the default); the job as --trainer (a function,
    "FILE.py:FUNCTION") or --model (a name). A notebook's function is pickled under
    `studies_dir`."""
    _refuse_unknown(list(given))
    fields: dict[str, Any] = {}
    set_by: dict[str, str] = {}
    for name, value in given.items():
        if value is None:
            continue
        keyword = keywords()[name]
        field = str(keyword.param.name)
        if field in set_by:
            raise UsageError(
                f"{set_by[field]}= and {name}= both set {keyword.param.opts[0]}: give one"
            )
        set_by[field] = name
        fields[field] = _converted(name, keyword, value)
    if "objective" in fields:
        fields["objective"] = Objective(fields["objective"])
    if callable(job):
        fields["trainer"] = reference_of(job, studies_dir)
    elif ":" in job and not Path(job).exists():  # FILE.py:FUNCTION, package.module:FUNCTION
        fields["trainer"] = job
    else:
        fields["model"] = job
    return fields


def _refuse_unknown(names: list[str]) -> None:
    """A UsageError for the first keyword of the CLI only, else for every unknown one,
    with the names it may have meant."""
    for name in names:
        if name in _NOT_FROM_PYTHON:
            raise UsageError(f"autotune.search() takes no {name}=: {_NOT_FROM_PYTHON[name]}")
    unknown = [name for name in names if name not in keywords()]
    if not unknown:
        return
    said = []
    for name in unknown:
        close = difflib.get_close_matches(name, [n for n, k in keywords().items() if k.flag])
        meant = " or ".join(f"{c}=" for c in close)
        said.append(f"{name}=" + (f" (did you mean {meant}?)" if meant else ""))
    raise UsageError(
        f"autotune.search() has no option {', '.join(said)}; its options are the flags of "
        "`autotune search`, dashes as underscores (docs/api.md lists them)"
    )


def _converted(name: str, keyword: Keyword, value: Any) -> Any:
    """A keyword's value as the flag's would be: a list joined as the command line gives
    it (a --lever's commas are its values'), then checked and converted by the flag's
    click type."""
    param = keyword.param
    given = value = value.value if isinstance(value, enum.Enum) else value  # Objective.X
    if param.multiple and isinstance(value, str):
        value = (value,)
    elif isinstance(param.type, ListType) and isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    try:
        converted = param.type_cast_value(click.Context(click.Command("search")), value)
    except click.BadParameter as exc:
        raise UsageError(f"{name}={given!r}: {exc.message}") from None
    return not converted if keyword.negated else converted


def options_table() -> str:
    """docs/api.md's table of `autotune.search`'s options, from the flags' declaration:
    each flag's keywords, what it takes, its default, and the first sentence of its help."""
    defaults = {f.name: f.default for f in dataclasses.fields(SearchOptions)}
    rows = ["| keyword | takes | default | help |", "| --- | --- | --- | --- |"]
    for param in _search_flags():
        names = [n for n, k in keywords().items() if k.param is param and k.flag]
        help_text = param.help or ""
        cells = [
            ", ".join(f"`{n}`" for n in names),
            _takes(param),
            _default(defaults[str(param.name)], help_text),
            _first_sentence(help_text),
        ]
        cells = [c.replace("|", "\\|").replace("<", "\\<") for c in cells]  # not HTML
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _takes(param: click.Option) -> str:
    """What a flag's keyword takes from Python."""
    kind = param.type
    if param.is_flag:
        return "bool"
    if param.multiple:
        return f"list of str (`{param.metavar}`)" if param.metavar else "list of str"
    if isinstance(kind, click.Choice):
        return "one of " + ", ".join(f'`"{c}"`' for c in kind.choices)
    if isinstance(kind, ListType):
        return "list of " + (", ".join(f'`"{c}"`' for c in kind.choices or ()) or "str")
    if isinstance(kind, click.IntRange):
        if kind.max is None:
            return f"int >= {kind.min}"
        return f"int from {kind.min} to {kind.max}"
    if isinstance(kind, ParsedType):
        return _PARSED.get(kind.name, "str")
    return "str or Path" if isinstance(kind, click.Path) else "str"


def _default(default: Any, help_text: str) -> str:
    """A field's default, or where there is none the one its flag's help states."""
    if default is None or default == ():
        stated = re.search(r"\[default: ([^]]*)\]", help_text)
        return stated.group(1) if stated else "none"
    if isinstance(default, str):  # an Objective too: a StrEnum
        return f'`"{default}"`'
    return f"`{default}`"


def _first_sentence(help_text: str) -> str:
    text = re.sub(r"\s*\[default: [^]]*\]", "", help_text)
    return re.split(r"(?<=\.)(?<!e\.g\.)(?<!i\.e\.)\s+", text, maxsplit=1)[0]


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


def _parsed(value: Any, parse: Any, name: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return parse(value)
    except ValueError as exc:
        raise UsageError(f"{name}={value!r}: {exc}") from None


if __name__ == "__main__":  # python -m autotune.api: docs/api.md's options table
    print(options_table(), end="")
