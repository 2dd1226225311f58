"""--parallel: several workers on one study on this machine, the cores split between them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import optuna
import pytest
from conftest import (
    TINY_GPT2,
    autotune,
    probe_trials,
    running_trial_of,
    worker_search_args,
    write_model,
)
from optuna.exceptions import StorageInternalError
from optuna.trial import TrialState
from sqlalchemy.exc import OperationalError

from autotune.core.errors import UsageError
from autotune.tuning.workers import Slot, plan_slots


def test_the_cores_are_split_evenly_between_workers() -> None:
    cores = sorted(os.sched_getaffinity(0))
    slots = plan_slots("cpu", len(cores), None)
    assert [s.cores for s in slots] == [(c,) for c in cores]
    assert plan_slots("cuda", 1, ("0", "3"), 4) == [Slot(gpu="0"), Slot(gpu="3")]


def test_gpu_ids_are_checked_against_the_gpus_this_process_sees() -> None:
    with pytest.raises(UsageError, match="3 is not a GPU index here; this process sees 2"):
        plan_slots("cuda", 1, ("0", "3"), 2)
    with pytest.raises(UsageError, match="x is not a GPU index"):
        plan_slots("cuda", 1, ("x",), 2)


def test_asking_for_more_workers_than_cores_or_for_gpus_on_the_cpu_is_refused() -> None:
    with pytest.raises(UsageError, match="needs at least"):
        plan_slots("cpu", len(os.sched_getaffinity(0)) + 1, None)
    with pytest.raises(UsageError, match="--devices needs CUDA"):
        plan_slots("cpu", 1, ("0",))


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_parallel_search_probes_distinct_configs_and_confirms_alone(tmp_path: Path) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    done = autotune(tmp_path, *worker_search_args(4), "--parallel", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    cores = sorted(os.sched_getaffinity(0))
    share = len(cores) // 2  # each worker gets an even share of this machine's cores
    first = ",".join(map(str, cores[:share]))
    second = ",".join(map(str, cores[share : 2 * share]))
    assert f"worker 0: cores {first}" in done.stdout, done.stdout
    assert f"worker 1: cores {second}" in done.stdout, done.stdout
    storage = f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"
    trials = optuna.load_study(study_name="tiny", storage=storage).get_trials(deepcopy=False)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    finished = [t for t in trials if "result" in t.user_attrs]
    probes = probe_trials(trials)
    assert len(probes) == 4
    assert len({t.user_attrs["claim"] for t in probes}) == 4
    assert {json.loads(t.user_attrs["result"])["concurrent"] for t in probes} == {2}
    confirmations = [t for t in finished if "confirms" in t.user_attrs]
    assert confirmations, "the finalist was not measured again alone"
    assert {json.loads(t.user_attrs["result"])["concurrent"] for t in confirmations} == {1}
    assert (tmp_path / "studies" / "tiny.best.json").exists()
    # The job files (study folders; no storage URL) are gone once the workers are.
    assert not list((tmp_path / "studies" / "tiny" / "workers").glob("*.json"))


def probing(storage: str, pid: int) -> bool:
    """The worker of this pid has claimed a running trial (its probe is under way)."""
    try:
        study = optuna.load_study(study_name="tiny", storage=storage)
        return running_trial_of(study, pid) is not None
    except (KeyError, OSError, StorageInternalError, OperationalError):
        return False  # not created yet, or busy: ask again


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_worker_killed_mid_search_fails_the_search_loudly_and_a_rerun_finishes(
    tmp_path: Path,
) -> None:
    """The kernel's OOM killer takes a worker: the search says which worker and how it
    ended, exports nothing, and the rerun recovers the dead worker's trial and finishes."""
    import signal
    import subprocess
    import sys
    import time

    write_model(tmp_path / "tiny", TINY_GPT2)
    argv = [*worker_search_args(4), "--parallel", "2"]
    search = subprocess.Popen(
        [sys.executable, "-m", "autotune", *argv],
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    worker = None
    deadline = time.monotonic() + 120
    while worker is None and time.monotonic() < deadline and search.poll() is None:
        for entry in Path("/proc").iterdir():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            # this test's worker 1: another test's search may be running beside it
            ours = cwd == str(tmp_path)
            if ours and b"autotune.worker" in cmdline and cmdline[-2].endswith(b"1.json"):
                worker = int(entry.name)
        time.sleep(0.05)
    assert worker is not None, "worker 1 never started"
    storage = f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"
    while not probing(storage, worker):  # killed mid-probe: its trial claimed, running
        assert search.poll() is None and time.monotonic() < deadline, search.communicate()
        time.sleep(0.2)
    os.kill(worker, signal.SIGKILL)
    out, err = search.communicate(timeout=600)
    assert search.returncode == 1, out + err
    assert "worker 1 exited with -9" in err and "rerun the command to resume" in err
    assert not (tmp_path / "studies" / "tiny.best.json").exists()
    done = autotune(tmp_path, *argv)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = optuna.load_study(study_name="tiny", storage=storage).get_trials(deepcopy=False)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert (tmp_path / "studies" / "tiny.best.json").exists()
