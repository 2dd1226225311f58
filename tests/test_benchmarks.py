"""Smoke test: the benchmark scripts run end to end in their --quick form.

vs_default.py is not in it: its --quick form trains each of its three ways after a
search (2m40s on 2 cores), more than the suite can spare under its 20 minutes. Run it
by hand after changing the search or the benchmarks' training child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("fidelity.py", "| selected |"),
        ("seed_table.py", "| 8-bit adam |"),
        ("scaleout.py", "| 2 workers (--parallel 2) |"),
    ],
)
def test_benchmark_runs_quick(script: str, expected: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / script),
            "--quick",
            *([] if script == "scaleout.py" else ["--no-append"]),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert expected in done.stdout


def test_the_soaks_smallest_setting_finds_nothing_left_behind() -> None:
    """benchmarks/soak.py at two minutes: one search of each kind (to its end, Ctrl-C,
    SIGKILL, the study file locked a while, a resume, the user's factory), each checked
    for processes left alive and counts that grew."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--minutes", "2", "--light"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Problems: none." in done.stdout
    kinds = {json.loads(line)["kind"] for line in done.stdout.splitlines() if line[:2] == '{"'}
    assert kinds == {"stand-in", "factory", "resume", "ctrl-c", "sigkill", "storage-busy"}
