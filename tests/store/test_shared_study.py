"""Two workers on one study in a real PostgreSQL server, as on two machines."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from conftest import TINY_GPT2, probe_trials, worker_search_args, write_model
from optuna.trial import TrialState

from autotune.core.paths import study_folder

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

MAX_TRIALS = 6


def search(work: Path, url: str, study: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "autotune", *worker_search_args(MAX_TRIALS)]
    argv += ["--storage", url, "--study", study]
    return subprocess.Popen(
        argv,
        cwd=work,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def running_trial_of(study: optuna.Study, pid: int) -> optuna.trial.FrozenTrial | None:
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if trial.user_attrs.get("pid") == pid and "claim" in trial.user_attrs:
            return trial
    return None


def test_two_workers_share_one_study_and_recover_a_killed_ones_trial(
    tmp_path: Path, postgres_url: str
) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    name = f"shared-{uuid.uuid4().hex[:8]}"  # the server may be reused between runs
    first = search(tmp_path, postgres_url, name)
    deadline = time.monotonic() + 240
    second = None
    killed = None
    while killed is None and time.monotonic() < deadline:
        try:
            study = optuna.load_study(study_name=name, storage=postgres_url)
        except KeyError:
            time.sleep(0.2)  # not created yet
            continue
        if second is None:  # the second worker joins the study the first one created
            second = search(tmp_path, postgres_url, name)
        killed = running_trial_of(study, first.pid)
        time.sleep(0.2)
    if second is None:
        first.kill()
        raise AssertionError(f"the first worker never created the study: {first.communicate()[0]}")
    if killed is None:
        first.kill()
        second.kill()
        second.wait()
        raise AssertionError(f"the first worker never started a trial: {first.communicate()[0]}")
    first.kill()  # as a machine going down: no cleanup runs in it
    first.wait()
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out

    study = optuna.load_study(study_name=name, storage=postgres_url)
    trials = study.get_trials(deepcopy=False)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    # The killed worker's trial: failed, and its config probed again by the survivor.
    lost = trials[killed.number]
    assert lost.state == TrialState.FAIL and "died" in lost.user_attrs["reason"]
    probes = probe_trials(trials)
    claims = [t.user_attrs["claim"] for t in probes]
    assert len(claims) == len(set(claims)), "a config was probed twice"
    assert len(probes) == MAX_TRIALS
    assert killed.user_attrs["claim"] in claims
    assert all(t.state == TrialState.COMPLETE for t in probes)
    # Another storage than the default: the study's files are keyed by it.
    folder = study_folder(tmp_path / "studies", name, postgres_url)
    assert folder.name != name and (folder / "trials").is_dir()
    assert (tmp_path / "studies" / f"{folder.name}.best.json").exists()
