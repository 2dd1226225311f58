"""A storage that goes away mid-search (a PostgreSQL restart): the search rides it out."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from conftest import (
    ROOT,
    TINY_GPT2,
    probe_trials,
    probes_running,
    worker_search_args,
    write_model,
)
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


def test_a_result_the_storage_was_away_for_is_kept_and_recorded_by_the_rerun(
    own_server: tuple[str, Path], tmp_path: Path
) -> None:
    """PostgreSQL stopped while a probe runs, for longer than the search waits: the search
    stops in one line, keeps the probe's result in its folder, and the rerun records it
    instead of probing the config again."""
    url, folder = own_server
    write_model(tmp_path / "tiny", TINY_GPT2)
    argv = [*worker_search_args(3), "--study", "away", "--storage", url, "--confirm-top", "0"]
    argv[argv.index("--measure-steps") + 1] = "30"  # a probe runs long enough to be caught
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "AUTOTUNE_STORAGE_PATIENCE_S": "3"}
    search = subprocess.Popen(
        [sys.executable, "-m", "autotune", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    probe = None
    try:
        # the probe held still while the server stops (which takes seconds): it ends once
        # the storage is away, not before, however quickly this host trains it
        probe = wait_for_probe(tmp_path, search)
        os.kill(probe, signal.SIGSTOP)
        running = wait_for_running_trial(url, "away", search)
        postgres("--stop", folder)
        os.kill(probe, signal.SIGCONT)
        _, err = search.communicate(timeout=300)
    finally:
        if search.poll() is None:
            search.kill()
        if probe is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(probe, signal.SIGCONT)  # never left stopped
        postgres("--start", folder)
    last = err.strip().splitlines()[-1]
    assert search.returncode == 1 and "Traceback" not in err, err
    assert last.startswith("error: the storage was unreachable for 3 s"), last
    assert f"trial {running}'s result is kept in" in last and "rerun" in last
    assert probes_running(tmp_path) == []
    kept = next((tmp_path / "studies").glob(f"away-*/trials/{running}/unrecorded.json"))

    env.pop("AUTOTUNE_STORAGE_PATIENCE_S")
    rerun = subprocess.run(
        [sys.executable, "-m", "autotune", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert rerun.returncode == 0, rerun.stderr
    trials = optuna.load_study(study_name="away", storage=url).get_trials(deepcopy=False)
    dead = trials[running]
    assert dead.state == TrialState.FAIL and "recorded" in dead.user_attrs["reason"]
    recorded = [t for t in probe_trials(trials) if t.params == dead.params]
    assert len(recorded) == 1 and "recorded from" in recorded[0].user_attrs["reason"]
    assert not kept.exists()
    configs = [tuple(sorted(t.params.items())) for t in probe_trials(trials)]
    assert len(configs) == len(set(configs)) == 3  # nothing probed twice


def postgres(action: str, folder: Path) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / ".ci" / "postgres"), action, str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def wait_for_probe(work: Path, search: subprocess.Popen[str]) -> int:
    """The pid of the search's first probe, once it runs."""
    deadline = time.monotonic() + 180
    while not (pids := probes_running(work, trials_only=True)):
        assert search.poll() is None and time.monotonic() < deadline, search.communicate()
        time.sleep(0.1)
    return pids[0]


def wait_for_running_trial(url: str, name: str, search: subprocess.Popen[str]) -> int:
    """The number of the first trial a probe runs for (claimed, so its folder is named)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert search.poll() is None, search.communicate()
        time.sleep(0.3)
        try:
            trials = optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)
        except KeyError:  # not created yet
            continue
        claimed = [t for t in trials if t.state == TrialState.RUNNING and "claim" in t.user_attrs]
        if claimed:
            return claimed[0].number
    raise AssertionError("no probe started")
