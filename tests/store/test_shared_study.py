"""Two workers on one study, as on two machines: in a real PostgreSQL server, or in a
journal file on a filesystem they share."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from conftest import (
    TINY_GPT2,
    probe_trials,
    running_trial_of,
    worker_search_args,
    write_model,
)
from optuna.trial import TrialState

from autotune.core.paths import study_folder

pytestmark = [pytest.mark.slow]

MAX_TRIALS = 6


def search(
    work: Path, url: str, study: str, extra: tuple[str, ...] | list[str] = ()
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "autotune", *worker_search_args(MAX_TRIALS), *extra]
    # Optuna's random sampler: the model sampler may rightly stop before MAX_TRIALS
    # (nothing untried can win), and this test counts probes
    argv += ["--storage", url, "--study", study, "--sampler", "random"]
    return subprocess.Popen(
        argv,
        cwd=work,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.parametrize(
    "backend", ["journal", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_two_workers_share_one_study_and_recover_a_killed_ones_trial(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    url = shared_storage(tmp_path, backend, request)
    name = f"shared-{uuid.uuid4().hex[:8]}"  # the server may be reused between runs
    first = search(tmp_path, url, name)
    deadline = time.monotonic() + 240
    second = None
    killed = None
    while killed is None and time.monotonic() < deadline:
        try:
            study = load(name, url)
        except KeyError:
            time.sleep(0.2)  # not created yet
            continue
        if second is None:  # the second worker joins the study the first one created
            second = search(tmp_path, url, name)
        killed = running_trial_of(study, first.pid)
        if killed is None:  # found: killed at once, before its probe can end
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

    study = load(name, url)
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
    folder = study_folder(tmp_path / "studies", name, url)
    assert folder.name != name and (folder / "trials").is_dir()
    assert (tmp_path / "studies" / f"{folder.name}.best.json").exists()


def load(name: str, url: str) -> optuna.Study:
    """The study as a reader opens it (Optuna takes a journal file's path as a URL)."""
    from autotune.store.storage import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(url))


def shared_storage(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"
    if backend == "journal":
        return str(tmp_path / "autotune.log")  # on a filesystem both machines mount
    return str(request.getfixturevalue("postgres_url"))


@pytest.mark.parametrize(
    "backend", ["journal", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_trial_whose_worker_on_another_machine_went_silent_is_probed_again(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """A worker on another host claimed a config and stopped sending heartbeats (its
    machine lost power): a search here cannot see its process, so only the lapsed
    heartbeat tells; it fails the trial with that reason and measures the config."""
    from autotune.core.trial import Candidate
    from autotune.store import compat
    from autotune.store._coordination import claim_key
    from autotune.store.storage import open_storage

    write_model(tmp_path / "tiny", TINY_GPT2)
    url = shared_storage(tmp_path, backend, request)
    name = f"silent-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "AUTOTUNE_HEARTBEAT_S": "1"}
    argv = [
        sys.executable,
        "-m",
        "autotune",
        *worker_search_args(1),
        "--storage",
        url,
        "--study",
        name,
        "--confirm-top",
        "0",
    ]
    first = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert first.returncode == 0, first.stdout + first.stderr
    os.environ["AUTOTUNE_HEARTBEAT_S"] = "1"
    try:
        storage = open_storage(url)
    finally:
        del os.environ["AUTOTUNE_HEARTBEAT_S"]
    study = optuna.load_study(study_name=name, storage=storage)
    measured = probe_trials(study.get_trials(deepcopy=False))[0]
    others = (
        {"per_device_train_batch_size": 16}
        if measured.params["per_device_train_batch_size"] == 8
        else {"per_device_train_batch_size": 8}
    )
    params = {**measured.params, **others}
    study.enqueue_trial(params)
    silent = study.ask()
    batch = params["per_device_train_batch_size"]
    config = Candidate(
        batch, 16 // batch, params["precision"], params["activation_checkpointing"], params["optim"]
    )
    for key, value in {
        "worker": "far-away|pid:[1]|4242|abc",
        "host": "far-away",
        "pid": 4242,
        "claim": claim_key(config),
    }.items():
        silent.set_user_attr(key, value)
    compat.record_heartbeat(storage, compat.trial_id(storage, study, silent.number))
    time.sleep(4)  # past the grace period: three 1 s heartbeat intervals
    rerun = subprocess.run(
        [*argv[:-4], "--max-trials", "2", *argv[-4:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    trials = load(name, url).get_trials(deepcopy=False)
    recovered = trials[silent.number]
    assert recovered.state == TrialState.FAIL
    assert "stopped sending heartbeats" in recovered.user_attrs["reason"]
    again = [t for t in probe_trials(trials) if t.params == params]
    assert again and again[0].user_attrs["outcome"] == "ok"


def recorded_ok(name: str, url: str) -> bool:
    """Whether the study has a probe measured ok and finished, as export reads it (its
    attributes are written one commit at a time before the trial completes); False
    before the study exists."""
    try:
        trials = load(name, url).get_trials(deepcopy=False)
    except Exception:  # not created yet (on SQLite, the file may not exist yet)
        return False
    return any(
        t.state == TrialState.COMPLETE and t.user_attrs.get("outcome") == "ok"
        for t in probe_trials(trials)
    )


def hold_still(url: str, *processes: subprocess.Popen[str]) -> None:
    """Stop the processes where none is in the middle of a write to the study: a search
    stopped while it commits to SQLite would keep every reader (the export) waiting out
    SQLite's lock timeout. PostgreSQL's readers never wait for a writer."""
    path = url.removeprefix("sqlite:///")
    for _ in range(100):
        for process in processes:
            os.kill(process.pid, signal.SIGSTOP)
        if path == url:
            return
        try:
            with contextlib.closing(sqlite3.connect(path, timeout=0.2)) as db:
                db.execute("SELECT count(*) FROM trials").fetchone()
            return
        except sqlite3.OperationalError:  # locked: let the write end, and try again
            for process in processes:
                os.kill(process.pid, signal.SIGCONT)
            time.sleep(0.05)
    raise AssertionError("the searches never left the study unlocked")


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_two_searches_started_at_once_both_finish_and_export_meanwhile_says_so(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """The same command in two shells at the same moment: both finish, no config is
    probed twice, and an export taken while they run writes the best so far and says
    that a search is still running."""
    from conftest import autotune, probes_running

    write_model(tmp_path / "tiny", TINY_GPT2)
    name = f"twice-{uuid.uuid4().hex[:8]}"
    url = shared_storage(tmp_path, backend, request)
    quick = ["--confirm-top", "0"]  # two searches' exploring is the point
    first, second = search(tmp_path, url, name, quick), search(tmp_path, url, name, quick)
    deadline = time.monotonic() + 240
    while not recorded_ok(name, url):  # the searches run while the test looks
        assert time.monotonic() < deadline, "no probe was measured ok in 4 minutes"
        assert first.poll() is None and second.poll() is None
        time.sleep(0.5)
    try:  # held until the export has looked: a tiny study's searches can otherwise end first
        hold_still(url, first, second)
        assert first.poll() is None and second.poll() is None
        meanwhile = autotune(tmp_path, "export", "--study", name, "--storage", url)
    finally:
        for process in (first, second):  # never left stopped, whatever failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
    assert meanwhile.returncode == 0, meanwhile.stderr
    assert "a search of this study is still running" in meanwhile.stderr
    for process in (first, second):
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output
    trials = load(name, url).get_trials(deepcopy=False)
    configs = [tuple(sorted(t.params.items())) for t in probe_trials(trials)]
    assert len(configs) == len(set(configs)) == MAX_TRIALS
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert probes_running(tmp_path) == []
    after = autotune(tmp_path, "export", "--study", name, "--storage", url)
    assert after.returncode == 0 and "still running" not in after.stderr
