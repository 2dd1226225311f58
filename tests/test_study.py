"""The study as a shared, durable record: resume rules, claims, heartbeats.

Claims and heartbeats run against SQLite and against a real PostgreSQL server.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import optuna
import pytest
from helpers import SPEC, cand
from optuna.trial import TrialState

from autotune.store import study as studies
from autotune.store.study import (
    _same_search,
    candidate_params,
    contested,
    distributions,
    heartbeat,
    mark_running,
    open_study,
    recover_stale,
)


def test_a_study_made_before_a_new_setting_existed_still_resumes() -> None:
    old = json.dumps({"model": "m", "seq_len": 64})
    assert _same_search(old, json.dumps({"model": "m", "seq_len": 64, "base_arguments": {}}))
    assert not _same_search(
        old, json.dumps({"model": "m", "seq_len": 64, "base_arguments": {"lr": 1}})
    )
    assert not _same_search(old, json.dumps({"model": "m", "seq_len": 128}))
    assert not _same_search(old, json.dumps({"model": "m"}))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'studies.db'}"
    return str(request.getfixturevalue("postgres_url"))


def worker(storage: str, name: str) -> optuna.Study:
    """A study handle with its own connection, as a second searching process has."""
    return open_study(storage=storage, name=name, spec=SPEC, sampler=studies.make_sampler("tpe", 0))


def test_two_workers_claiming_one_config_never_both_run_it(storage: str) -> None:
    name = f"claims-{uuid.uuid4().hex[:8]}"
    a, b = worker(storage, name), worker(storage, name)
    config = cand(16)
    a.enqueue_trial(candidate_params(config))
    a.enqueue_trial(candidate_params(config))
    ta, tb = a.ask(distributions(SPEC)), b.ask(distributions(SPEC))
    mark_running(ta, config)
    mark_running(tb, config)
    # Both claimed before either looked: both yield; neither runs it.
    assert contested(a, ta.number, config, 10) == f"trial {tb.number} is probing the same config"
    assert contested(b, tb.number, config, 10) == f"trial {ta.number} is probing the same config"
    b.tell(tb, state=TrialState.PRUNED)
    assert contested(a, ta.number, config, 10) is None  # a looks again after b yielded: a runs
    late = b.ask(distributions(SPEC))
    mark_running(late, config)
    assert contested(b, late.number, config, 10) == f"trial {ta.number} is probing the same config"
    other = b.ask(distributions(SPEC))
    mark_running(other, cand(32))
    assert contested(b, other.number, cand(32), 2) == "other workers reached --max-trials 2"


def test_a_worker_that_stops_sending_heartbeats_loses_its_trial(
    storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(studies, "HEARTBEAT_S", 1)  # stale after 3 s without a heartbeat
    study = worker(storage, f"beats-{uuid.uuid4().hex[:8]}")
    study.enqueue_trial(candidate_params(cand(8)))
    trial = study.ask(distributions(SPEC))
    mark_running(trial, cand(8))
    trial.set_user_attr("host", "another-machine")  # only its heartbeat says it is alive
    with heartbeat(trial):
        time.sleep(4.5)
        assert recover_stale(study) == []
    time.sleep(4.5)
    assert recover_stale(study) == [trial.number]
    assert recover_stale(worker(storage, study.study_name)) == []  # recovered once only
    failed = study.get_trials(deepcopy=False)[trial.number]
    assert failed.state == TrialState.FAIL
    assert "heartbeats" in failed.user_attrs["reason"]
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == [candidate_params(cand(8))]
