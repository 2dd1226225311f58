"""The README's commands as a new user copies them: every `autotune` command in it and in
docs/ parses as the CLI parses it (no option that does not exist, no value it refuses),
the GPU block is the same sequence the "Tune your own training script" section explains,
and its train.py and my_args.json are what SFTConfig and Python accept."""

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


def test_the_gpu_block_is_the_sequence_the_tune_your_script_section_explains() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    head, body = readme.split("## Tune your own training script", 1)
    gpu = [c for c in _commands(head) if "--trainer" in c or c.startswith("autotune export")]
    explained = _commands(body.split("\n## ", 1)[0])
    assert gpu and gpu == explained[: len(gpu)]
    assert "python train.py my_args.json" in head and "python train.py my_args.json" in body


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
    ran = [*docs.try_out(readme), *gpu, docs.stand_in(readme)]
    ran += [*docs.review_block(readme), *docs.doctor(readme)]
    assert same(_commands(readme)) <= same(ran)
    assert docs.on_this_machine(gpu[0], gpu=False) == f"{gpu[0]} --device cpu"
    assert [docs.on_this_machine(c, gpu=False) for c in gpu[1:]] == gpu[1:]
    examples = (ROOT / "examples/README.md").read_text(encoding="utf-8")
    assert same(_commands(examples)) <= same(docs.shell_commands(examples))


def test_the_readmes_train_py_and_my_args_are_what_python_and_sftconfig_accept() -> None:
    from trl import SFTConfig

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (script,) = [b for b in _blocks(readme, "python") if b.startswith("# train.py")]
    namespace: dict[str, object] = {"__name__": "readme"}
    exec(compile(script, "train.py", "exec"), namespace)  # imports and defines, runs nothing
    make_trainer = namespace["make_trainer"]
    assert make_trainer.__annotations__["args"] in ("SFTConfig", SFTConfig)  # type: ignore[attr-defined]
    assert 'if __name__ == "__main__":' in script  # python train.py my_args.json trains
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
