"""Coordination between the workers of a study: the queue of configs, the trial a worker
asks for and claims, its heartbeat, and the recovery of a dead worker's trial.
`StudyStore.queue` is one; the search sees `Asked`, never Optuna's trial."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from autotune.core.files import write_atomic
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialResult, Verdict
from autotune.store import _coordination, compat
from autotune.store._params import candidate_of, candidate_params, distributions, has_candidate
from autotune.store._retry import transient_retry
from autotune.store.keys import Attr

UNRECORDED = "unrecorded.json"  # in a trial's folder: measured, but the storage was away
# records a finished trial of a config with its result: its number
Recorder = Callable[[Candidate, TrialResult, Verdict], int]


@dataclasses.dataclass(frozen=True)
class Asked:
    """A trial the store handed out: its config and whether it is a queued first guess.
    Optuna's trial behind it is the store's own: the search passes the value back to
    claim, heartbeat and tell, and never reads it."""

    trial: optuna.Trial = dataclasses.field(repr=False, compare=False)
    candidate: Candidate
    first_guess: bool

    @property
    def number(self) -> int:
        return self.trial.number


class StudyQueue:
    """The study's queue and claims (every call retries a storage away). `record` adds a
    finished trial: a dead worker's kept result is recorded through it."""

    def __init__(
        self,
        study: optuna.Study,
        storage: BaseStorage,
        url: str,
        spec: SearchSpec,
        record: Recorder,
    ) -> None:
        self.study = study
        self.storage = storage
        self.url = url
        self.spec = spec
        self._record = record
        self._ids: dict[int, int] = {}  # trial number -> the storage's id, which never changes

    @transient_retry
    def in_flight(self, exclude: int = -1) -> dict[Candidate, int]:
        """Configs being probed now (by any worker): config -> trial number."""
        return {
            candidate_of(self.spec.space, t.params): t.number
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if Attr.CLAIM in t.user_attrs and t.number != exclude and has_candidate(t.params)
        }

    @transient_retry
    def waiting(self) -> int:
        """Configs queued (first guesses, proposals) and not yet asked for."""
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    @transient_retry
    def was_queued(self, asked: Asked) -> bool:
        """The trial came from the queue, not from the sampler."""
        return compat.was_queued(self.storage, self._id(asked.number))

    @transient_retry
    def is_empty(self) -> bool:
        return not self.study.get_trials(deepcopy=False)

    @transient_retry
    def enqueue(self, candidate: Candidate, *, first_guess: bool = False) -> None:
        attrs = {str(Attr.FIRST_GUESS): True} if first_guess else None  # probes may rule it out
        self.study.enqueue_trial(candidate_params(candidate, self.spec.space), user_attrs=attrs)

    @transient_retry
    def ask(self) -> Asked:
        """The next trial to run, never the one another worker just took.

        Optuna hands out a queued trial by reading its state and then setting it running;
        PostgreSQL and MySQL lock the row in between, SQLite does not, and two workers on
        one SQLite file were seen taking the same trial. On SQLite the workers take turns
        through a lock file beside the database. A journal file needs no turn (nor the
        fcntl() lock many NFS mounts lack): its replay gives a queued trial to the first
        worker whose write set it running, and the others ask again."""
        with _coordination.sqlite_turn(self.url):
            trial = self.study.ask(distributions(self.spec.space))
        candidate = candidate_of(self.spec.space, trial.params)
        return Asked(trial, candidate, bool(trial.user_attrs.get(Attr.FIRST_GUESS)))

    @transient_retry
    def claim(self, asked: Asked, max_trials: int, folder: str) -> str | None:
        """Claim the config for this trial and name its folder; the reason to yield when
        another worker holds the config (or the study already has `max_trials` probes),
        else None. TrialLost when another worker failed the trial meanwhile."""
        trial, candidate = asked.trial, asked.candidate
        with _lost_if_finished(trial):
            for key, value in _coordination.worker_identity().items():
                trial.set_user_attr(key, value)
            trial.set_user_attr(Attr.CLAIM, _coordination.claim_key(candidate))
            trial.set_user_attr(Attr.TRIAL_DIR, folder)
            compat.record_heartbeat(self.storage, self._id(trial.number))
        trials = self.study.get_trials(deepcopy=False)
        return _coordination.rival(trials, trial.number, candidate, max_trials)

    @contextlib.contextmanager
    def heartbeat(self, asked: Asked) -> Iterator[None]:
        with _coordination.heartbeat(self.storage, self._id(asked.number)):
            yield

    @transient_retry
    def recover_stale(self, judge: Callable[[TrialResult], Verdict] | None = None) -> list[int]:
        """Fail trials whose worker is gone and re-queue their configs; their numbers.

        With `judge`, a trial whose search measured it but could not record it (the
        storage stayed away, see `keep_unrecorded`) is recorded from its folder instead."""
        kept = functools.partial(self._kept_recorder, judge) if judge else None
        return _coordination.recover_stale(self.study, self.storage, kept)

    @staticmethod
    def keep_unrecorded(folder: str, result: TrialResult) -> Path:
        """Keep a measured result the storage could not take, for the next run to record."""
        path = Path(folder) / UNRECORDED
        write_atomic(path, result.to_json())
        return path

    def _kept_recorder(
        self, judge: Callable[[TrialResult], Verdict], trial: optuna.trial.FrozenTrial
    ) -> Callable[[], object] | None:
        """What records the result kept in a dead trial's folder as a finished trial of
        its config; None when none is kept or it cannot be read (the config is re-queued)."""
        path = Path(str(trial.user_attrs.get(Attr.TRIAL_DIR, ""))) / UNRECORDED
        try:
            kept = TrialResult.from_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None
        kept = kept.replace(reason="; ".join(filter(None, [kept.reason, f"recorded from {path}"])))
        candidate = candidate_of(self.spec.space, trial.params)

        def record() -> None:
            self._record(candidate, kept, judge(kept))
            path.unlink(missing_ok=True)

        return record

    def fail_and_requeue(self, asked: Asked, why: str) -> None:
        """A trial stopped by its own search (Ctrl-C, a full disk): failed, config re-queued.
        Two calls, each retried on its own: retried as one, a storage away at the re-queue
        would retry the fail, find the trial finished and lose the config."""
        if self._fail(asked, why):
            self.enqueue(asked.candidate)

    @transient_retry
    def _fail(self, asked: Asked, why: str) -> bool:
        """Fail the trial; False where another worker already failed (and re-queued) it."""
        trial = asked.trial
        try:
            trial.set_user_attr(Attr.OUTCOME, "error")
            trial.set_user_attr(Attr.REASON, f"{why}; re-queued")
            self.study.tell(trial, state=TrialState.FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as exc:
            if not already_finished(exc):
                raise
            return False
        return True

    @transient_retry
    def _id(self, number: int) -> int:
        """The storage's id of a trial: looked up once (a storage away is waited out, as
        the heartbeat's start may be the first call after a restart), then remembered."""
        if number not in self._ids:
            self._ids[number] = compat.trial_id(self.storage, self.study, number)
        return self._ids[number]


class TrialLost(Exception):
    """The trial was finished by another worker (which judged it abandoned and re-queued
    its config): this worker drops it and asks again."""


@contextlib.contextmanager
def _lost_if_finished(trial: optuna.Trial) -> Iterator[None]:
    try:
        yield
    except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as exc:
        if not already_finished(exc):
            raise
        raise TrialLost(f"trial {trial.number} was taken over by another worker") from None


def already_finished(exc: BaseException) -> bool:
    """Optuna's ways of saying a trial is already finished: UpdateFinishedTrialError from
    an attribute write, ValueError("Cannot tell a FAIL trial.") from study.tell."""
    if isinstance(exc, optuna.exceptions.UpdateFinishedTrialError):
        return True
    return str(exc).startswith("Cannot tell a")
