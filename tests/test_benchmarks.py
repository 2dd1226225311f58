"""The benchmarks stay runnable: each answers --help with the harness's --quick and
--record, every command the docs write is one its script takes, and the simulated
families (the search's rules against the recorded grids, no probe trained) run in their
smallest form and pick the rule's best.

The others' --quick runs are a search or more each (the soak's two minutes, fidelity's
about 3, the job benchmarks 3-5, main_job 12, docs_as_written 45), more than the suite's
20 minutes can spare: run `python benchmarks/NAME.py --quick` by hand after changing the
search or the harness.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(
    path
    for path in [*BENCHMARKS.glob("*.py"), *BENCHMARKS.glob("gpu/*.py")]
    if not path.name.startswith("_") and path.name not in ("harness.py", "stamped.py")
)


def test_every_benchmark_is_found() -> None:
    names = {path.stem for path in SCRIPTS}
    assert {"families", "scaleout", "soak", "peak_breakdown"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_a_benchmark_answers_help_with_its_smallest_setting_and_its_record(
    script: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its imports resolve (a renamed harness part fails here, not at the next run) and
    its command line is the harness's."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(script), run_name="__main__")
    assert exited.value.code in (0, None)
    usage = capsys.readouterr().out
    assert "--quick" in usage and "--record" in usage, usage[:400]


# A benchmark's command as the docs write it: `python benchmarks/NAME.py ARGS` or a code
# span `benchmarks/NAME.py ARGS`, its args to the end of the span, the line or a comment
# (continued lines joined, [optional] brackets dropped, the shell's redirections cut)
COMMAND = re.compile(r"(?:python3? |`)benchmarks/([a-z_/]+\.py)([^`\n#]*)")
SHELL = (")", ">", "|", ";", "&&")
DOCUMENTS = [
    ROOT / "README.md",
    BENCHMARKS / "README.md",
    BENCHMARKS / "gpu" / "device_check.sh",
    *(ROOT / "docs").glob("*.md"),
    *SCRIPTS,
]


def documented_commands() -> list[tuple[str, Path, list[str]]]:
    found = []
    for document in DOCUMENTS:
        text = re.sub(r"\\+\n", " ", document.read_text())
        for match in COMMAND.finditer(text):
            script = BENCHMARKS / match[1]
            if script not in SCRIPTS:
                continue
            words = shlex.split(match[2].replace("[", " ").replace("]", " "))
            cut = next((i for i, w in enumerate(words) if w.startswith(SHELL)), len(words))
            found.append((f"{document.name}: {match[0].strip()}", script, words[:cut]))
    return found


class Parsed(Exception):
    pass


@pytest.mark.parametrize(
    ("where", "script", "argv"), documented_commands(), ids=lambda value: str(value)[:60]
)
def test_a_documented_benchmark_command_is_one_its_script_takes(
    where: str, script: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every `benchmarks/NAME.py ...` the README, the docs, device_check.sh and the
    scripts' own docstrings write is parsed by that script's command line."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import harness

    def parse_only(bench: harness.Benchmark, _: object = None) -> None:
        harness.parser(bench).parse_args(argv)
        raise Parsed

    monkeypatch.setattr(harness, "run", parse_only)
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    with pytest.raises(Parsed):
        runpy.run_path(str(script), run_name="__main__")


def _quick(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


@pytest.mark.slow
def test_the_simulated_families_smallest_setting_picks_the_rules_best() -> None:
    """benchmarks/families_simulated.py --quick: the real search's rules (proposals,
    stops, confirmation, the duel, selection) on gpt2 and its LoRA with memory free, two
    seeds each, every probe answered from the recorded grid: each search exports the
    best config the rule may export, or one the grid ties with it (#68's bar: >= 0.98
    mean, >= 0.95 worst)."""
    done = _quick(str(BENCHMARKS / "families_simulated.py"), "--quick")
    assert done.returncode == 0, done.stderr[-3000:]
    figures, _ = json.JSONDecoder().raw_decode(done.stdout[done.stdout.index("\n{") + 1 :])
    settings = {s["setting"]: s for s in figures["settings"]}
    assert len(settings) == 2 and all(s["probes"] > 0 for s in settings.values())
    for name, setting in settings.items():
        ratios = setting["ratios"]
        assert len(ratios) == 2 and min(ratios) >= 0.95 and statistics.mean(ratios) >= 0.98, name


def test_the_families_report_of_a_regrid_whose_budget_moved_has_empty_cells(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`families.py --regrid --rebudget` drops a memory-binds setting's searches with its
    old budget: the report prints the new grids with empty cells, where it failed on the
    mean of no searches and lost the regrid's record (2026-11-30)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import families

    recorded = json.loads((BENCHMARKS / "families.json").read_text())
    for row in families.selected(recorded, "memory binds"):
        row["methods"] = {}
    figures = {
        **recorded,
        "only": "memory binds",
        "methods": ["autotune"],
        "mode": "measured again",
    }
    text = families.report({**figures, "commit": "abc", "command": "families.py --regrid"})
    assert "| all |  |  |  |" in text
    assert text.count("memory binds (") == len(families.selected(recorded, "memory binds"))
