"""A storage that goes away mid-search (a PostgreSQL restart): the search rides it out."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from conftest import ROOT, TINY_GPT2, probe_trials, worker_search_args, write_model
from optuna.trial import TrialState

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def own_server() -> Iterator[tuple[str, Path]]:
    """A server of this test's own, so restarting it disturbs no other test."""
    folder = Path(tempfile.mkdtemp(prefix="autotune-pg-outage-"))
    started = subprocess.run(
        ["bash", str(ROOT / ".ci" / "postgres"), str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if started.returncode != 0:
        pytest.skip(f"no PostgreSQL server could be started: {started.stderr.strip()[:200]}")
    try:
        yield started.stdout.strip(), folder
    finally:
        subprocess.run(
            ["bash", str(ROOT / ".ci" / "postgres"), "--stop", str(folder)],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(folder, ignore_errors=True)


def test_a_search_rides_out_a_database_restart(
    own_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, folder = own_server
    write_model(tmp_path / "tiny", TINY_GPT2)
    argv = [*worker_search_args(4), "--study", "outage", "--storage", url, "--confirm-top", "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "AUTOTUNE_HEARTBEAT_S": "2"}
    search = subprocess.Popen(
        [sys.executable, "-m", "autotune", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and search.poll() is None:
            time.sleep(0.5)
            try:
                study = optuna.load_study(study_name="outage", storage=url)
            except KeyError:  # not created yet
                continue
            if any(t.state == TrialState.RUNNING for t in study.get_trials(deepcopy=False)):
                break
        restarted = subprocess.run(
            ["bash", str(ROOT / ".ci" / "postgres"), "--restart", str(folder)],
            capture_output=True,
            text=True,
        )
        assert restarted.returncode == 0, restarted.stderr
        output, _ = search.communicate(timeout=600)
    finally:
        if search.poll() is None:
            search.kill()
    assert search.returncode == 0, output
    trials = optuna.load_study(study_name="outage", storage=url).get_trials(deepcopy=False)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert len(probe_trials(trials)) == 4, output
