"""Many workers on one study: claims on configs, heartbeats, recovery of dead workers' trials.

A worker is a searching process: this machine's search, a `--parallel` worker, or a
search on another machine sharing the storage. Each writes a claim before it probes
and records a heartbeat while it does; a trial whose worker is gone is failed and its
config goes back in the queue.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import os
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from autotune.core.checkpointing import as_recorded
from autotune.core.enums import Outcome
from autotune.core.paths import pid_alive
from autotune.core.trial import Candidate, TrialRecord
from autotune.store import compat
from autotune.store._retry import transient_retry
from autotune.store.keys import Attr

# This process, as other workers see it. The pid namespace tells containers that share a
# hostname apart; the random part tells apart two processes that reuse one pid, and the
# process's start time tells a worker on this host from a later process given its pid.
HOST = socket.gethostname()
WORKER_ID = uuid.uuid4().hex[:12]


def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def started_at(pid: int) -> str:
    """When the process of this pid started, in clock ticks since boot ('' when it is
    not there, or this system has no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def worker_identity() -> dict[str, object]:
    """This worker's attributes, in the order they are written: each is its own commit,
    so the whole identity goes first and a reader never judges a half-written one."""
    pid = os.getpid()
    return {
        Attr.WORKER: f"{HOST}|{pid_namespace()}|{pid}|{WORKER_ID}|{started_at(pid)}",
        Attr.HOST: HOST,
        Attr.PID: pid,
    }


def claim_key(candidate: Candidate) -> str:
    c = candidate
    ckpt = as_recorded(c.activation_checkpointing, (c.activation_checkpointing,))
    key = f"{c.per_device_train_batch_size}|{c.precision}|{ckpt}|{c.optim}"
    if c.train_sampling_strategy != "random":
        key += f"|{c.train_sampling_strategy}"
    # every lever away from its plain default (a key without levers reads as before)
    defaults = {f.name: f.default for f in dataclasses.fields(Candidate)}
    return key + "".join(
        f"|{name}={value}" for name, value in c.lever_values().items() if value != defaults[name]
    )


def rival(
    trials: list[FrozenTrial], number: int, candidate: Candidate, max_trials: int
) -> str | None:
    """Why a freshly claimed trial must yield, or None when its claim holds.

    Every worker writes its claim before it reads the others', and yields on seeing
    any rival claim. Two workers that pick one config at the same moment may both
    yield (and pick again), but both can never run it: the second to read always
    sees the first one's claim."""
    mine = claim_key(candidate)
    probes = 1  # this one
    for other in trials:
        if other.number == number:
            continue
        attrs = other.user_attrs
        if other.state == TrialState.RUNNING and Attr.CLAIM in attrs:
            probes += 1
            if attrs[Attr.CLAIM] == mine:
                return f"trial {other.number} is probing the same config"
        elif other.state in (TrialState.COMPLETE, TrialState.FAIL) and Attr.RESULT in attrs:
            if Attr.CONFIRMS in attrs or Attr.REUSED in attrs:
                continue  # not a probe: --max-trials counts probes
            if attrs.get(Attr.OUTCOME) == Outcome.SKIPPED:
                continue
            probes += 1
            if attrs.get(Attr.CLAIM) == mine:
                return f"trial {other.number} measured the same config"
    if probes > max_trials:
        return f"other workers reached --max-trials {max_trials}"
    return None


def _orphaned(trial: FrozenTrial, grace_s: float) -> bool:
    """A running trial no worker ever claimed (its ask failed half-way, say while the
    storage went away): no heartbeat will ever make it stale, so it goes after the grace."""
    if Attr.WORKER in trial.user_attrs or Attr.HOST in trial.user_attrs:
        return False
    started = trial.datetime_start
    if started is None:
        return False
    return (datetime.datetime.now() - started).total_seconds() > grace_s


def dead_here(trial: FrozenTrial) -> bool:
    """A running trial whose worker was on this host, in this pid namespace, and is gone:
    no process has its pid, or the one that has it started later (the pid was reused)."""
    worker = str(trial.user_attrs.get(Attr.WORKER, ""))
    host, namespace, pid, _, started = [*worker.split("|"), "", "", "", "", ""][:5]
    if not worker:  # recorded before workers had an id: host and pid alone
        host, namespace, pid = (
            str(trial.user_attrs.get(Attr.HOST)),
            "",
            str(trial.user_attrs.get(Attr.PID, "")),
        )
    if host != HOST or (namespace and namespace != pid_namespace()) or not pid.isdigit():
        return False  # elsewhere, or no pid to look for: heartbeats decide
    if not pid_alive(int(pid)):
        return True
    now = started_at(int(pid))  # recorded by workers since; '' where /proc cannot say
    return bool(started and now and now != started)


@contextlib.contextmanager
def heartbeat(storage: BaseStorage, trial_id: int) -> Iterator[None]:
    """Record the trial's heartbeat every interval while the block runs.

    Unlike Optuna's own heartbeat thread, a failed write (a database restarting) does not
    end the beats: the next interval tries again, and the trial goes stale only when
    the storage stays unreachable for the whole grace period."""
    stop = threading.Event()
    interval = compat.heartbeat_interval(storage)

    def beat() -> None:
        while True:
            try:
                compat.record_heartbeat(storage, trial_id)
            except Exception as exc:  # transient: the storage is away; try again
                print(f"heartbeat not recorded ({type(exc).__name__}); retrying", file=sys.stderr)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def recover_stale(
    study: optuna.Study,
    storage: BaseStorage,
    kept: Callable[[FrozenTrial], Callable[[], object] | None] | None = None,
) -> list[int]:
    """Fail running trials whose worker is gone and put their configs back in the queue;
    returns their numbers.

    Gone: a worker on this host (and pid namespace) that no longer exists, seen at once,
    or a worker anywhere whose heartbeat is older than the grace period. The reason is
    written before the trial is failed (a finished trial takes no more attributes), so
    Optuna's `fail_stale_trials`, which fails first, does not serve.

    `kept` gives what records a result the dead search measured but could not record
    (the storage was away), kept in the trial's folder: recorded, it is not probed again."""
    stale = set(compat.stale_trial_ids(storage, study))
    recovered = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        tid = compat.trial_id(storage, study, trial.number)
        here = dead_here(trial)
        orphan = _orphaned(trial, 3 * compat.heartbeat_interval(storage))
        if tid not in stale and not here and not orphan:
            continue
        why = (
            "search process died"
            if here
            else "worker stopped sending heartbeats"
            if not orphan
            else "its worker never claimed it"
        )
        record = kept(trial) if kept is not None else None
        then = "its result, kept in its folder, recorded" if record else "re-queued"
        try:
            storage.set_trial_user_attr(tid, Attr.OUTCOME, str(Outcome.ERROR))
            storage.set_trial_user_attr(tid, Attr.REASON, f"{why} during the trial; {then}")
            if not storage.set_trial_state_values(tid, state=TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker recovered it (or it finished) first
        if record is not None:
            record()
            recovered.append(trial.number)
            continue
        if trial.params:
            _requeue(study, trial.params)
        recovered.append(trial.number)
    return recovered


@transient_retry
def _requeue(study: optuna.Study, params: dict[str, object]) -> None:
    """Put a failed trial's config back in the queue (retried alone: the trial is failed
    already, so a retry of the whole recovery would not come back to it)."""
    study.enqueue_trial(params, skip_if_exists=False)


def sqlite_lock_path(url: str) -> Path | None:
    """The lock file SQLite workers take turns through when they ask for a trial."""
    if not url.startswith("sqlite:///"):
        return None
    return Path(url.removeprefix("sqlite:///") + ".lock")


@contextlib.contextmanager
def sqlite_turn(url: str) -> Iterator[None]:
    """This worker's turn on a SQLite study (through its lock file); on a server, no
    wait (the server locks rows itself)."""
    path = sqlite_lock_path(url)
    if path is None:
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def one_per_config(records: list[TrialRecord]) -> list[TrialRecord]:
    """Drop a measurement taken over from another study where the study has its own of
    that config, or took it over already: two workers starting together on a server
    without the SQLite lock may both take it over, or one take over what another is
    probing."""
    own = {r.candidate for r in records if not r.result.reused_from}
    kept, taken = [], set()
    for record in records:
        if record.result.reused_from:
            if record.candidate in own or record.candidate in taken:
                continue
            taken.add(record.candidate)
        kept.append(record)
    return kept
