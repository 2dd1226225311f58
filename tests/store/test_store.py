"""The study as a shared, durable record: resume rules, claims, heartbeats.

Claims and heartbeats run against SQLite and against a real PostgreSQL server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import SPEC, cand, drop_once
from optuna.trial import TrialState

from autotune.core.enums import Outcome
from autotune.core.trial import TrialResult, Verdict
from autotune.store import _coordination
from autotune.store._identity import same_search
from autotune.store._params import candidate_params
from autotune.store.keys import Attr
from autotune.store.queue import TrialLost
from autotune.store.samplers import make_sampler
from autotune.store.store import StudyStore

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def test_a_study_made_before_a_new_setting_existed_still_resumes() -> None:
    old = json.dumps({"model": "m", "seq_len": 64})
    assert same_search(old, json.dumps({"model": "m", "seq_len": 64, "base_arguments": {}}))
    assert not same_search(
        old, json.dumps({"model": "m", "seq_len": 64, "base_arguments": {"lr": 1}})
    )
    assert not same_search(old, json.dumps({"model": "m", "seq_len": 128}))
    assert not same_search(old, json.dumps({"model": "m"}))


@pytest.fixture(params=["sqlite", "journal", pytest.param("postgres", marks=pytest.mark.postgres)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'studies.db'}"
    if request.param == "journal":
        return str(tmp_path / "studies.log")  # a journal file, as on a shared filesystem
    return str(request.getfixturevalue("postgres_url"))


def worker(storage: str, name: str) -> StudyStore:
    """A store with its own connection, as a second searching process has."""
    return StudyStore.open(url=storage, name=name, spec=SPEC, sampler=make_sampler("tpe", 0))


def test_two_workers_claiming_one_config_never_both_run_it(storage: str) -> None:
    name = f"claims-{uuid.uuid4().hex[:8]}"
    a, b = worker(storage, name), worker(storage, name)
    config = cand(16)
    a.queue.enqueue(config)
    a.queue.enqueue(config)
    ta, tb = a.queue.ask(), b.queue.ask()
    ca, cb = ta.candidate, tb.candidate
    assert ca == cb == config
    # Both claim before either looks: both yield; neither runs it.
    assert a.queue.claim(ta, 10, "trials/x") is None  # a looked before b claimed
    assert b.queue.claim(tb, 10, "trials/x") == f"trial {ta.number} is probing the same config"
    b.tell(tb, TrialResult(Outcome.SKIPPED, reason="yield"), Verdict(None, None, pruned=True))
    b.queue.enqueue(config)
    late = b.queue.ask()
    assert b.queue.claim(late, 10, "trials/x") == f"trial {ta.number} is probing the same config"
    b.queue.enqueue(cand(32))
    other = b.queue.ask()
    assert b.queue.claim(other, 2, "trials/x") == "other workers reached --max-trials 2"


def test_claim_rule_when_two_workers_claim_before_either_reads() -> None:
    trials = []
    for number in (0, 1):
        trial = _running(number, cand(16))
        trials.append(trial)
    assert _coordination.rival(trials, 0, cand(16), 10) == "trial 1 is probing the same config"
    assert _coordination.rival(trials, 1, cand(16), 10) == "trial 0 is probing the same config"
    assert _coordination.rival(trials[:1], 0, cand(16), 10) is None


def _running(number: int, config: object) -> object:
    import optuna

    return optuna.trial.FrozenTrial(
        number=number,
        state=TrialState.RUNNING,
        value=None,
        values=None,
        datetime_start=None,
        datetime_complete=None,
        params={},
        distributions={},
        user_attrs={Attr.CLAIM: _coordination.claim_key(config)},  # type: ignore[arg-type]
        system_attrs={},
        intermediate_values={},
        trial_id=number,
    )


def test_a_worker_that_stops_sending_heartbeats_loses_its_trial(
    storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1")  # stale after 3 s without a heartbeat
    store = worker(storage, f"beats-{uuid.uuid4().hex[:8]}")
    store.queue.enqueue(cand(8))
    trial = store.queue.ask()
    assert store.queue.claim(trial, 10, "trials/x") is None
    trial.trial.set_user_attr(Attr.WORKER, "another-machine|ns|1|x")  # only its heartbeat counts
    with store.queue.heartbeat(trial):
        time.sleep(4.5)
        assert store.queue.recover_stale() == []
    time.sleep(4.5)
    assert store.queue.recover_stale() == [trial.number]
    assert worker(storage, store.name).queue.recover_stale() == []  # recovered once only
    failed = store.study.get_trials(deepcopy=False)[trial.number]
    assert failed.state == TrialState.FAIL
    assert "heartbeats" in failed.user_attrs[Attr.REASON]
    waiting = store.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == [candidate_params(cand(8))]


def test_a_dead_search_on_this_host_loses_its_trial_at_once(storage: str) -> None:
    store = worker(storage, f"dead-{uuid.uuid4().hex[:8]}")
    store.queue.enqueue(cand(8))
    trial = store.queue.ask()
    store.queue.claim(trial, 10, "trials/x")
    ns = _coordination.pid_namespace()
    trial.trial.set_user_attr(Attr.WORKER, f"{_coordination.HOST}|{ns}|999999999|gone")
    assert store.queue.recover_stale() == [trial.number]
    reason = store.study.get_trials(deepcopy=False)[trial.number].user_attrs[Attr.REASON]
    assert "search process died" in reason


def test_a_dead_search_whose_pid_another_process_took_loses_its_trial_at_once(
    storage: str,
) -> None:
    """A busy host reuses pids within minutes: a live process with the dead worker's pid
    but a later start is not that worker, and does not hold its trial until heartbeats
    lapse. The worker itself, with its own start, keeps its trial."""
    store = worker(storage, f"reused-{uuid.uuid4().hex[:8]}")
    store.queue.enqueue(cand(8))
    trial = store.queue.ask()
    store.queue.claim(trial, 10, "trials/x")
    identity = str(next(iter(_coordination.worker_identity().values())))
    assert identity.endswith(f"|{_coordination.started_at(os.getpid())}")
    assert store.queue.recover_stale() == []  # this live worker's own
    host, ns, pid, _, started = identity.split("|")
    trial.trial.set_user_attr(Attr.WORKER, f"{host}|{ns}|{pid}|gone|{int(started) - 1}")
    assert store.queue.recover_stale() == [trial.number]
    reason = store.study.get_trials(deepcopy=False)[trial.number].user_attrs[Attr.REASON]
    assert "search process died" in reason


def test_a_live_worker_in_another_pid_namespace_keeps_its_trial(storage: str) -> None:
    """Containers can share a hostname without sharing pids: a pid that does not exist
    here says nothing about a worker in another pid namespace."""
    store = worker(storage, f"ns-{uuid.uuid4().hex[:8]}")
    store.queue.enqueue(cand(8))
    trial = store.queue.ask()
    store.queue.claim(trial, 10, "trials/x")
    trial.trial.set_user_attr(Attr.WORKER, f"{_coordination.HOST}|pid:[1]|999999999|other")
    assert store.queue.recover_stale() == []


def test_a_claim_seen_half_written_is_not_taken_for_a_dead_worker(storage: str) -> None:
    """Each attribute is its own commit: another worker can read the trial between them.
    A trial whose host is written but not yet its pid belongs to a live worker."""
    store = worker(storage, f"half-{uuid.uuid4().hex[:8]}")
    store.queue.enqueue(cand(8))
    trial = store.queue.ask()
    trial.trial.set_user_attr(Attr.HOST, _coordination.HOST)
    assert worker(storage, store.name).queue.recover_stale() == []
    assert next(iter(_coordination.worker_identity())) == Attr.WORKER  # the whole id goes first


def test_a_claimed_trial_read_before_its_params_is_not_yet_in_flight(storage: str) -> None:
    """SQLite reads a trial's params and its attributes in separate statements, so
    another search can see a claim before the params it read: that trial is not in
    flight yet (the claim's rival check still settles who runs the config), and reading
    it does not fail the search (two searches on one SQLite study did)."""
    store = worker(storage, f"params-{uuid.uuid4().hex[:8]}")
    store.queue.enqueue(cand(8))
    asked = store.queue.claim(store.queue.ask(), 10, "trials/x")
    assert asked is None
    half = store.study.ask()  # running, no params yet, as read mid-ask
    half.set_user_attr(Attr.CLAIM, "read before its params")
    assert list(worker(storage, store.name).queue.in_flight().values()) == [0]


def test_a_worker_whose_trial_was_taken_over_drops_it(storage: str) -> None:
    store = worker(storage, f"lost-{uuid.uuid4().hex[:8]}")
    store.queue.enqueue(cand(8))
    trial = store.queue.ask()
    worker(storage, store.name).study.tell(trial.number, state=TrialState.FAIL)  # elsewhere
    with pytest.raises(TrialLost, match=f"trial {trial.number} was taken over"):
        store.queue.claim(trial, 10, "trials/x")


CONTEND = """
import sys, time
from helpers import SPEC, cand
from autotune.core.enums import Outcome
from autotune.core.trial import TrialResult, Verdict
from autotune.store.samplers import make_sampler
from autotune.store.queue import TrialLost
from autotune.store.store import StudyStore
url, name, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = StudyStore.open(url=url, name=name, spec=SPEC, sampler=make_sampler("random", 0))
while time.time() < start:
    time.sleep(0.005)
for _ in range(60):
    assert store.queue.recover_stale() == [], "a live worker's trial was recovered"
    trial = store.queue.ask()
    config = trial.candidate
    print(trial.number, flush=True)
    store.queue.enqueue(cand(8))
    store.queue.claim(trial, 10_000, "trials/x")  # TrialLost fails the test
    store.tell(trial, TrialResult(Outcome.SKIPPED, reason="x"), Verdict(None, None, pruned=True))
"""


@pytest.mark.slow
def test_two_processes_asking_one_sqlite_study_never_share_or_lose_a_trial(
    tmp_path: Path,
) -> None:
    """Two workers hammering one SQLite file: each asked trial is one worker's alone, and
    no worker takes another's live trial for a dead one (seen on CI: a half-written
    claim read as a dead worker's)."""
    url, name = f"sqlite:///{tmp_path / 'studies.db'}", "contend"
    worker(url, name).queue.enqueue(cand(8))  # the storage and study exist before both start
    script = tmp_path / "contend.py"
    script.write_text(CONTEND)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    start = str(time.time() + 8)  # both are imported and open by then
    runs = [
        subprocess.Popen(
            [sys.executable, str(script), url, name, start],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    for run, (_, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err
    asked = [out.split() for out, _ in outputs]
    assert len(asked[0]) == len(asked[1]) == 60
    assert not set(asked[0]) & set(asked[1])


def proposals(tmp_path: Path, sampler: str, seed: int) -> list[str]:
    """Eight configs a fresh study proposes, each told a result that depends on it alone."""
    url = f"sqlite:///{tmp_path / f'{sampler}-{seed}-{uuid.uuid4().hex[:6]}.db'}"
    store = StudyStore.open(url=url, name="s", spec=SPEC, sampler=make_sampler(sampler, seed))
    seen = []
    for _ in range(8):  # four past TPE's random start-up
        trial = store.queue.ask()
        config = trial.candidate
        seen.append(config.describe())
        speed = 100.0 / config.per_device_train_batch_size + len(config.precision)
        result = TrialResult(Outcome.OK, samples_per_s=speed, peak_memory_bytes=2**30)
        store.tell(trial, result, Verdict((speed, 1.0), -1.0))
    return seen


@pytest.mark.parametrize("sampler", ["tpe", "random", "nsga2"])
def test_the_same_seed_proposes_the_same_configs_and_another_seed_does_not(
    tmp_path: Path, sampler: str
) -> None:
    """--seed makes a search repeatable: same results told, same proposals."""
    first = proposals(tmp_path, sampler, 7)
    assert proposals(tmp_path, sampler, 7) == first
    assert proposals(tmp_path, sampler, 8) != first


def test_confirmation_runs_keep_their_rounds_for_paired_comparison(tmp_path: Path) -> None:
    """A confirmation made in an interleaved round comes back with its round and its
    quiet step time; one made outside any round is pooled but paired with nothing."""
    from autotune.tuning.selection import verdict

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    store = StudyStore.open(url=url, name="rounds", spec=SPEC, sampler=make_sampler("tpe", 0))
    store.queue.enqueue(cand(8))
    trial = store.queue.ask()

    def run(step_s: float) -> TrialResult:
        return TrialResult(
            Outcome.OK,
            samples_per_s=64 / step_s,
            peak_memory_bytes=2**30,
            step_time_median_s=step_s,
            step_times_s=(step_s,) * 4,
        )

    store.tell(trial, run(1.0), verdict(run(1.0), SPEC, implied=False))
    (record,) = store.records()
    assert store.next_round() == 0
    store.add_confirmation(record, run(0.9), verdict(run(0.9), SPEC, implied=False), "a", 0)
    store.add_confirmation(record, run(0.8), verdict(run(0.8), SPEC, implied=False), "b")
    assert store.next_round() == 1
    (record,) = store.records()
    assert record.runs == 3 and record.rounds == ((0, 0.9),)


def test_a_probe_that_starts_as_the_storage_restarts_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen on CI: the restart fell between a trial's claim and its heartbeat's start."""
    store = worker(f"sqlite:///{tmp_path / 'studies.db'}", "restart")
    store.queue.enqueue(cand(8))
    asked = store.queue.ask()
    calls = drop_once(monkeypatch, store.queue.storage, "get_study_id_from_name")
    with store.queue.heartbeat(asked):
        pass
    assert calls == ["get_study_id_from_name"] * 2  # dropped, then waited out
    assert store.queue.claim(asked, 10, "trials/x") is None
    with store.queue.heartbeat(asked):  # its id is known: the storage is not asked again
        pass
    assert len(calls) == 2


def test_taking_over_rides_out_a_storage_restart_and_adds_each_config_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = worker(f"sqlite:///{tmp_path / 'studies.db'}", "restart")
    measured = TrialResult(Outcome.OK, samples_per_s=16.0, peak_memory_bytes=1 << 30)
    verdict = Verdict((16.0, 1.0), -1.0)
    calls = drop_once(monkeypatch, store.study, "get_trials")
    taken = store.take_over({cand(8): measured, cand(16): measured}, lambda _: verdict)
    assert sorted(c.per_device_train_batch_size for _, c, _ in taken) == [8, 16]
    assert sorted(r.candidate.per_device_train_batch_size for r in store.records()) == [8, 16]
    assert len(calls) >= 2  # dropped, then read again


def test_a_stopped_trials_config_is_requeued_though_the_storage_drops_the_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retried as one call, a drop at the re-queue retried the fail, which found the
    trial finished and returned: the config was lost."""
    store = worker(f"sqlite:///{tmp_path / 'studies.db'}", "restart")
    store.queue.enqueue(cand(8))
    asked = store.queue.ask()
    calls = drop_once(monkeypatch, store.study, "enqueue_trial")
    store.queue.fail_and_requeue(asked, "interrupted")
    assert len(calls) == 2 and store.queue.waiting() == 1
