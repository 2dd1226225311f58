"""The README's commands as a new user copies them: every `autotune` command in it and in
docs/ parses as the CLI parses it (no option that does not exist, no value it refuses),
the GPU quick start's train.py and args.json are examples/quickstart/'s and what SFTConfig
and Python accept, and benchmarks/docs_as_written.py runs every command they write."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from autotune.cli import cli

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples/README.md"]


def _commands(text: str) -> list[str]:
    """Each `autotune ...` command of a code block (fenced, or indented by four spaces),
    continuation lines joined, comments dropped; the part after `&&` where a line
    chains an install."""
    joined = re.sub(r"\\\n\s*", " ", text)
    fenced = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", joined, flags=re.S))
    indented = [line for line in joined.splitlines() if line.startswith("    ")]
    found = []
    for line in [*fenced.splitlines(), *indented]:
        for part in line.strip().split("&&"):
            part = part.split(" #", 1)[0].strip()
            if part.startswith("autotune "):
                found.append(part)
    return list(dict.fromkeys(found))


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_autotune_command_in_the_docs_parses(doc: Path) -> None:
    import click

    for command in _commands(doc.read_text(encoding="utf-8")):
        argv = shlex.split(command)[1:]
        if not argv or argv[0].startswith("$") or "<" in command or "..." in command:
            continue  # a placeholder, not a command to copy
        group = cli.make_context("autotune", list(argv), resilient_parsing=True)
        sub = cli.get_command(group, argv[0])
        assert sub is not None, f"{doc.name}: no command {argv[0]!r} in {command!r}"
        try:
            sub.make_context(argv[0], argv[1:], parent=group)
        except click.exceptions.Exit:
            pass  # --help
        except click.UsageError as exc:
            pytest.fail(f"{doc.name}: {command!r} is refused: {exc.format_message()}")


def test_the_quick_starts_files_are_the_repositorys_as_the_readme_shows_them() -> None:
    """What a GPU user pastes is what tests/test_examples.py runs offline."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quickstart = ROOT / "examples" / "quickstart"
    (script,) = [b for b in _blocks(readme, "python") if b.startswith("# train.py")]
    (args_json,) = _blocks(readme, "json")
    assert script == (quickstart / "train.py").read_text(encoding="utf-8")
    assert args_json == (quickstart / "args.json").read_text(encoding="utf-8")
    assert "examples/quickstart" in readme


def test_the_docs_script_runs_every_command_the_readme_and_the_examples_write() -> None:
    """benchmarks/docs_as_written.py (45 minutes: the searches keep their time budgets)
    runs every command these two documents give, as written: the one change is
    `--device cpu` on a search written for a GPU, where there is none."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import docs_as_written as docs
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def same(commands: list[str]) -> set[str]:
        return {" ".join(c.split()) for c in commands}

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    gpu = docs.gpu_block(readme)
    ran = [*docs.try_out(readme), *gpu, *docs.review_block(readme)]
    ran += [*docs.demo(readme), *docs.doctor(readme)]
    assert same(_commands(readme)) <= same(ran)
    search = next(c for c in gpu if c.startswith("autotune search"))
    assert docs.on_this_machine(search, gpu=False) == f"{search} --device cpu"
    assert [docs.on_this_machine(c, gpu=False) for c in gpu if c != search] == [
        c for c in gpu if c != search
    ]
    examples = (ROOT / "examples/README.md").read_text(encoding="utf-8")
    assert same(_commands(examples)) <= same(docs.shell_commands(examples))


def test_the_readmes_train_py_and_args_are_what_python_and_sftconfig_accept() -> None:
    from trl import SFTConfig

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (script,) = [b for b in _blocks(readme, "python") if b.startswith("# train.py")]
    namespace: dict[str, object] = {"__name__": "readme"}
    exec(compile(script, "train.py", "exec"), namespace)  # imports and defines, runs nothing
    make_trainer = namespace["make_trainer"]
    assert make_trainer.__annotations__["args"] in ("SFTConfig", SFTConfig)  # type: ignore[attr-defined]
    assert 'if __name__ == "__main__":' in script  # python train.py args.json trains
    (args_json,) = _blocks(readme, "json")
    fields = json.loads(args_json)
    # on this CPU the export adds use_cpu (tuned on the CPU); on a GPU it is not needed
    args = SFTConfig(**fields, use_cpu=True)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 16


def test_the_docs_table_of_dimensions_is_the_declared_space() -> None:
    """docs/search.md's table names every declared dimension and lever, and no other,
    with the values the declarations give (a new one is not done until it has its row)."""
    from autotune.core.checkpointing import Checkpointing
    from autotune.core.enums import Precision
    from autotune.core.levers import DECLARED
    from autotune.core.optimizers import DEFAULT
    from autotune.core.space import SAMPLINGS

    text = (ROOT / "docs" / "search.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", text, flags=re.MULTILINE))
    classic = {
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "precision",
        "activation_checkpointing",
        "optim",
        "train_sampling_strategy",
    }
    assert set(rows) == classic | {lever.name for lever in DECLARED}

    def values(name: str) -> list[str]:
        return re.split(r"[,;]\s*", rows[name].strip())

    assert sorted(values("precision")) == sorted(p.value for p in Precision)
    assert values("activation_checkpointing") == [level.value for level in Checkpointing]
    assert tuple(values("optim")) == DEFAULT
    assert tuple(values("train_sampling_strategy")) == SAMPLINGS


def test_the_docs_list_every_field_the_export_may_change() -> None:
    """docs/export.md's list is what the search may write: every field a candidate sets
    on any device, every lever's fields (its TrainingArguments fields and those of your
    own class) at a value other than its plain one, and the rehearsal's evaluation batch."""
    from autotune.core.levers import DECLARED
    from autotune.hf.training_args import TUNED

    fields = set(TUNED) | {"per_device_eval_batch_size", "eval_accumulation_steps"}
    for lever in DECLARED:
        other = {"fsdp_mode": "full_shard"}.get(
            lever.name, True if isinstance(lever.plain, bool) else 1
        )
        fields |= {*lever.fields(other), *lever.class_fields(other), *lever.owns}
    listed = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    listed = listed.split("### What the export may change", 1)[1].split("\n## ", 1)[0]
    missing = sorted(f for f in fields if f"`{f}`" not in listed)
    assert not missing, f"docs/export.md does not list {missing}"
    examples = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    assert "only the fields docs/export.md lists" in examples
