"""Every use of Optuna beyond its documented API, in one adapter.

Optuna offers no public way to record one trial's heartbeat from our own thread or to
find a trial's storage id from a `Trial`; the few calls below reach for what the RDB
storage has. `tests/store/test_compat.py` fails loudly if an upgrade moves them, and
`pyproject.toml` bounds optuna below the next major version.
"""

from __future__ import annotations

import optuna
from optuna.storages import RDBStorage


def trial_id(storage: RDBStorage, study: optuna.Study, number: int) -> int:
    """The storage's id of a trial, from its number (public storage API)."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return int(storage.get_trial_id_from_study_id_trial_number(study_id, number))


def study_id(storage: RDBStorage, study: optuna.Study) -> int:
    return int(storage.get_study_id_from_name(study.study_name))


def record_heartbeat(storage: RDBStorage, trial: int) -> None:
    """Record that the trial's worker is alive now (RDBStorage.record_heartbeat: a method
    of Optuna's BaseHeartbeat, which the docs call not for direct use)."""
    storage.record_heartbeat(trial)


def stale_trial_ids(storage: RDBStorage, study: optuna.Study) -> list[int]:
    """Ids of running trials whose heartbeat is older than the grace period
    (RDBStorage._get_stale_trial_ids: Optuna's public fail_stale_trials fails them before
    a reason can be written, see coordination.recover_stale)."""
    return list(storage._get_stale_trial_ids(study_id(storage, study)))


def heartbeat_interval(storage: RDBStorage) -> int:
    interval = storage.get_heartbeat_interval()
    if interval is None:
        raise RuntimeError("the storage was opened without heartbeats")
    return int(interval)


def was_queued(storage: RDBStorage, trial: int) -> bool:
    """Whether the trial came from the queue (enqueue_trial: a first guess, a proposal,
    a re-queued config) rather than from the sampler: Optuna's enqueue_trial marks it
    with the system attribute fixed_params."""
    return "fixed_params" in storage.get_trial_system_attrs(trial)
