"""The benchmarks stay runnable: each answers --help with the harness's --quick and
--record, and the cheapest run end to end in their --quick form.

Not run here for the suite's 20 minutes (each a search or more): seed_table and
scaleout (a minute or two each: their probes and workers have their own tests),
vs_default, fidelity's evaluating runs, the job benchmarks (jobs, lora, packing,
evaluation_job), main_job (it needs mt5-small's config), families' grid,
checkpoint_levels, zero_stages, step_series, memory_terms, levers, parity,
docs_as_written (tests/test_readme.py parses its blocks; the whole is 45 minutes). Run
them by hand after changing the search or the harness: `python benchmarks/NAME.py
--quick`.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
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
@pytest.mark.parametrize(
    ("script", "expected"),
    # a search through the CLI read back with show, and the user's run beside its probe:
    # the harness's parts that most benchmarks use
    [("fidelity.py --runs capped", "| selected |")],
)
def test_benchmark_runs_quick(script: str, expected: str) -> None:
    """Its smallest setting to the end; without --record it prints and writes nothing."""
    name, *argv = script.split()
    records = [BENCHMARKS / "RESULTS.md", BENCHMARKS / f"{Path(name).stem}.json"]
    before = [path.stat().st_mtime_ns if path.exists() else 0 for path in records]
    done = _quick(str(BENCHMARKS / name), "--quick", *argv)
    assert done.returncode == 0, done.stderr[-3000:]
    assert expected in done.stdout
    assert [path.stat().st_mtime_ns if path.exists() else 0 for path in records] == before


@pytest.mark.slow
def test_the_soaks_smallest_setting_finds_nothing_left_behind() -> None:
    """benchmarks/soak.py at two minutes: one search of each kind (to its end, Ctrl-C,
    SIGKILL, the study file locked a while, a resume, the user's factory), each checked
    for processes left alive and counts that grew."""
    done = _quick(str(BENCHMARKS / "soak.py"), "--minutes", "2", "--light")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Problems: none." in done.stdout
    kinds = {json.loads(line)["kind"] for line in done.stdout.splitlines() if line[:2] == '{"'}
    assert kinds == {"stand-in", "factory", "resume", "ctrl-c", "sigkill", "storage-busy"}
