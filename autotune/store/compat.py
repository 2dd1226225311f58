"""Every use of Optuna beyond its documented API, in one adapter.

Optuna offers no public way to record one trial's heartbeat from our own thread or to
find a trial's storage id from a `Trial`; the few calls below reach for what the RDB
storage has. `tests/store/test_compat.py` fails loudly if an upgrade moves them, and
`pyproject.toml` bounds optuna below the next major version.

A journal file has no heartbeats of its own: a running trial's worker writes the time
into the trial's system attribute `autotune:heartbeat` instead, and a trial whose last
one is older than the grace period is stale, as in the RDB storage. Its workers' clocks
must agree within the grace period (NTP keeps them within milliseconds).
"""

from __future__ import annotations

import time

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import TrialState

from autotune.store.storage import heartbeat_s

BEAT = "autotune:heartbeat"  # a journal trial's last heartbeat, seconds since the epoch


def trial_id(storage: BaseStorage, study: optuna.Study, number: int) -> int:
    """The storage's id of a trial, from its number (public storage API)."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return int(storage.get_trial_id_from_study_id_trial_number(study_id, number))


def study_id(storage: BaseStorage, study: optuna.Study) -> int:
    return int(storage.get_study_id_from_name(study.study_name))


def record_heartbeat(storage: BaseStorage, trial: int) -> None:
    """Record that the trial's worker is alive now (RDBStorage.record_heartbeat: a method
    of Optuna's BaseHeartbeat, which the docs call not for direct use; in a journal, the
    trial's BEAT attribute)."""
    if isinstance(storage, RDBStorage):
        storage.record_heartbeat(trial)
        return
    try:
        storage.set_trial_system_attr(trial, BEAT, time.time())
    except optuna.exceptions.UpdateFinishedTrialError:
        pass  # another worker finished it meanwhile: as in the RDB storage, no error


def stale_trial_ids(storage: BaseStorage, study: optuna.Study) -> list[int]:
    """Ids of running trials whose heartbeat is older than the grace period
    (RDBStorage._get_stale_trial_ids: Optuna's public fail_stale_trials fails them before
    a reason can be written, see coordination.recover_stale)."""
    if isinstance(storage, RDBStorage):
        return list(storage._get_stale_trial_ids(study_id(storage, study)))
    oldest = time.time() - 3 * heartbeat_interval(storage)
    return [
        trial_id(storage, study, trial.number)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if float(trial.system_attrs.get(BEAT, oldest)) < oldest
    ]


def heartbeat_interval(storage: BaseStorage) -> int:
    if not isinstance(storage, RDBStorage):
        return heartbeat_s()  # a journal's beats are ours alone
    interval = storage.get_heartbeat_interval()
    if interval is None:
        raise RuntimeError("the storage was opened without heartbeats")
    return int(interval)


def was_queued(storage: BaseStorage, trial: int) -> bool:
    """Whether the trial came from the queue (enqueue_trial: a first guess, a proposal,
    a re-queued config) rather than from the sampler: Optuna's enqueue_trial marks it
    with the system attribute fixed_params."""
    return "fixed_params" in storage.get_trial_system_attrs(trial)
