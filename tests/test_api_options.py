"""`autotune.search` takes the flags of `autotune search` by their names, dashes as
underscores: docs/api.md's table is generated from the flags' declaration, and every
keyword it lists sets the field its flag sets, to the value the flag gives."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest
from conftest import ROOT

import autotune
from autotune import api
from autotune.cli import search as search_command
from autotune.cli_types import ListType, ParsedType
from autotune.core.enums import Objective
from autotune.core.errors import UsageError
from autotune.tuning.options import SearchOptions
from autotune.tuning.outcome import SearchOutcome

DOC = ROOT / "docs" / "api.md"
START, END = "<!-- generated from the flags' declaration", "<!-- end of the generated table -->"
# the values a flag's type is given, as the command line spells them
PARSED = {"SIZE": "3GiB", "DURATION": "7m", "FRACTION": "0.25"}


def documented_table() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("\n", text.index(START)) + 1
    return text[start : text.index(END)]


def documented_keywords() -> list[str]:
    """Every keyword docs/api.md's table lists: the backticked names of its first column."""
    rows = documented_table().splitlines()[2:]
    return [name for row in rows for name in re.findall(r"`(\w+)`", row.split(" | ")[0])]


def test_the_docs_table_is_the_one_the_flags_declare() -> None:
    assert documented_table() == api.options_table(), (
        "docs/api.md's options table is stale: paste `python -m autotune.api` between its markers"
    )


def flag_of(keyword: str) -> tuple[click.Option, str]:
    """The CLI's option a keyword names, found in the CLI's own command, and that name as
    a flag (`no_rehearse`: --no-rehearse)."""
    flag = "--" + keyword.replace("_", "-")
    for param in search_command.params:
        if isinstance(param, click.Option) and flag in (*param.opts, *param.secondary_opts):
            return param, flag
    raise AssertionError(f"{keyword}: no flag {flag} in `autotune search`")


def sample(param: click.Option, flag: str) -> tuple[list[str], Any]:
    """A value unlike the default, as command-line arguments and as a Python keyword's."""
    kind = param.type
    if param.is_flag and param.secondary_opts:  # --rehearse/--no-rehearse: both turn it off
        negated = flag in param.secondary_opts
        return [param.secondary_opts[0]], negated
    if param.is_flag:
        return [flag], True
    if param.multiple:
        levers = ["torch_compile=false", "attn_implementation=sdpa,eager"]
        return [part for lever in levers for part in (flag, lever)], levers
    if isinstance(kind, click.Choice):
        choice = str(kind.choices[-1])
        return [flag, choice], choice
    if isinstance(kind, click.IntRange):
        return [flag, str((kind.min or 0) + 5)], (kind.min or 0) + 5
    if isinstance(kind, ListType):
        items = [str(c) for c in kind.choices or ("a", "b")][:2]
        return [flag, ",".join(items)], items
    text = PARSED[kind.name] if isinstance(kind, ParsedType) else "some-value"
    return [flag, text], text


def captured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **options: Any) -> SearchOptions:
    """The SearchOptions `autotune.search` hands to the search, which is not run."""
    asked: list[SearchOptions] = []
    monkeypatch.setattr(api, "search_command", lambda o, **_: asked.append(o))
    autotune.search("tiny", studies_dir=tmp_path, **options)
    (options_object,) = asked
    return options_object


def test_the_table_lists_every_option_but_the_job_and_the_output_format() -> None:
    keywords = documented_keywords()
    fields = {str(flag_of(keyword)[0].name) for keyword in keywords}
    expected = {p.name for p in search_command.params} - {"trainer", "model", "fmt", "help"}
    assert fields == expected
    assert len(keywords) == len(set(keywords)) and "no_reuse" in keywords


@pytest.mark.parametrize("keyword", documented_keywords())
def test_every_documented_keyword_sets_its_flags_field(
    keyword: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`autotune.search(KEYWORD=value)` sets the field `autotune search --FLAG value` sets,
    to the same value, and one unlike its default."""
    param, flag = flag_of(keyword)
    argv, value = sample(param, flag)
    given = click.Context(search_command)
    search_command.parse_args(given, list(argv))
    field = str(param.name)
    from_cli = given.params[field]
    if field == "objective":
        from_cli = Objective(from_cli)
    asked = captured(monkeypatch, tmp_path, **{keyword: value})
    assert getattr(asked, field) == from_cli
    assert from_cli != getattr(SearchOptions(), field), "the sample must not be the default"


def test_the_fields_old_names_still_set_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`study_name=` and `levers=`, what `autotune.search` took before it took the flags'."""
    asked = captured(
        monkeypatch,
        tmp_path,
        study_name="mine",
        levers="torch_compile=false,true",  # one lever, its values comma-separated
        rehearse=False,
        checkpointing=["off", "on"],
        objective=Objective.EFFICIENCY,
        memory_budget=2**30,
        seq_len=None,  # the default
    )
    assert asked.study_name == "mine" and asked.levers == ("torch_compile=false,true",)
    assert asked.rehearse is False and asked.checkpointing == ("off", "on")
    assert asked.objective is Objective.EFFICIENCY and asked.memory_budget == 2**30
    assert asked.seq_len is None and asked.model == "tiny"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 8}, r"^autotune.search\(\) has no option batch_size= \(did you mean "),
        ({"levres": ["a"]}, r"has no option levres= \(did you mean lever= or"),
        ({"format": "json"}, r"takes no format=: it chooses how the CLI prints the outcome"),
        ({"model": "gpt2"}, r"takes no model=: the job is the first argument"),
        ({"debug": True}, r"takes no debug=: it shows the CLI's tracebacks"),
        ({"study": "a", "study_name": "b"}, r"^study= and study_name= both set --study"),
        ({"rehearse": True, "no_rehearse": True}, r"both set --rehearse"),
        ({"max_trials": 0}, r"^max_trials=0: 0 is not in the range x>=1"),
        ({"parity": "maybe"}, r"^parity='maybe': 'maybe' is not one of 'auto'"),
        ({"precisions": ["fp64"]}, r"^precisions=\['fp64'\]: fp64 not in fp32"),
        ({"trial_timeout": "soon"}, r"^trial_timeout='soon': "),
    ],
)
def test_a_wrong_keyword_or_value_is_refused_in_one_line(
    options: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(api, "search_command", lambda o, **_: pytest.fail("it searched"))
    with pytest.raises(UsageError, match=message) as refused:
        autotune.search("tiny", studies_dir=tmp_path, **options)
    assert "\n" not in str(refused.value)


def test_the_package_exports_what_search_returns_and_names_its_first_argument() -> None:
    assert autotune.SearchOutcome is SearchOutcome and "SearchOutcome" in autotune.__all__
    assert "autotune.search(job, " in (autotune.__doc__ or "")
    assert "autotune.search(job, " in DOC.read_text(encoding="utf-8")
