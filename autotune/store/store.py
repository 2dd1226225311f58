"""StudyStore: one search's study in an Optuna storage. The only code that reads or
writes Optuna trials; the search decides, the store records.

Figures and the outcome are user attributes with units in their names; the study's
values are (samples/s, peak memory GiB) with the budget as a constraint, so
optuna-dashboard shows the Pareto front.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.storages import RDBStorage
from optuna.trial import TrialState
from optuna_dashboard import save_note

from autotune.core.enums import Objective, Outcome
from autotune.core.errors import StudyError
from autotune.core.files import write_atomic
from autotune.core.parity_state import ParityPlan, ParityState
from autotune.core.rehearsal import Rehearsal
from autotune.core.spec import SearchSpec
from autotune.core.stats import combine, pooled, quiet_step_s
from autotune.core.trial import Candidate, TrialRecord, TrialResult, Verdict
from autotune.hf.training_args import study_arguments  # pure: imports no transformers
from autotune.store import _coordination, _identity, compat
from autotune.store._params import candidate_of, candidate_params, distributions
from autotune.store._retry import transient_retry
from autotune.store.keys import CONSTRAINT_NAME, METRIC_NAMES, Attr, StudyAttr
from autotune.store.storage import first_line, mask, open_storage, quiet_optuna

GIB = float(2**30)
UNRECORDED = "unrecorded.json"  # in a trial's folder: measured, but the storage was away


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


class StudyStore:
    """A study, its storage and its spec; built by `open` (search) or `load` (review)."""

    def __init__(
        self, study: optuna.Study, storage: RDBStorage, url: str, spec: SearchSpec
    ) -> None:
        self.study = study
        self.storage = storage
        self.url = url
        self.spec = spec

    @property
    def name(self) -> str:
        return self.study.study_name

    # ---- opening --------------------------------------------------------------------

    @classmethod
    def open(
        cls, *, url: str, name: str, spec: SearchSpec, sampler: optuna.samplers.BaseSampler
    ) -> StudyStore:
        """Create the study, or resume it when it holds the same search; refuse otherwise."""
        quiet_optuna()
        storage = open_storage(url)
        try:
            study = optuna.create_study(
                storage=storage,
                study_name=name,
                sampler=sampler,
                load_if_exists=True,
                directions=["maximize", "minimize"],
            )
        except (optuna.exceptions.DuplicatedStudyError, sqlalchemy.exc.IntegrityError):
            # Another worker created the study at the same moment: join it.
            study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
        except Exception as exc:  # a path that cannot be created or written, a bad URL
            raise StudyError(f"cannot open storage {mask(url)!r}: {first_line(exc)}") from None
        store = cls(study, storage, url, spec)
        store._check_identity()
        return store

    @classmethod
    def load(cls, *, url: str, name: str) -> StudyStore:
        """An existing study and the spec it was created with (for export and review)."""
        quiet_optuna()
        storage = open_storage(url)
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            raise StudyError(
                f"no study named {name!r} in {mask(url)}; run `autotune search` first or "
                "check --storage"
            ) from None
        except Exception as exc:
            raise StudyError(f"cannot open storage {mask(url)!r}: {first_line(exc)}") from None
        raw = study.user_attrs.get(StudyAttr.SPEC)
        if raw is None:
            raise StudyError(
                f"study {name!r} was not made by autotune (it has no {StudyAttr.SPEC})"
            )
        with _readable(name, url, "its search spec"):
            spec = SearchSpec.from_json(raw)
        return cls(study, storage, url, spec)

    @staticmethod
    def stored_spec(*, url: str, name: str) -> SearchSpec | None:
        """The spec a study of this name was made with; None when there is none yet (a
        SQLite file that does not exist is not created)."""
        path = url.removeprefix("sqlite:///")
        if path != url and not Path(path).exists():
            return None
        quiet_optuna()
        storage = open_storage(url)
        try:
            study_id = storage.get_study_id_from_name(name)
        except KeyError:
            return None
        except Exception as exc:
            raise StudyError(f"cannot open storage {mask(url)!r}: {first_line(exc)}") from None
        raw = storage.get_study_user_attrs(study_id).get(StudyAttr.SPEC)
        with _readable(name, url, "its search spec"):
            return SearchSpec.from_json(raw) if raw else None

    def _check_identity(self) -> None:
        wanted = json.dumps(self.spec.identity(), sort_keys=True)
        stored = self.study.user_attrs.get(StudyAttr.IDENTITY)
        if stored is None:
            self.study.set_user_attr(StudyAttr.IDENTITY, wanted)
            self.study.set_user_attr(StudyAttr.SPEC, self.spec.to_json())
            self.study.set_user_attr(StudyAttr.DESCRIPTION, self.spec.describe())
            self.study.set_metric_names(list(METRIC_NAMES))
            save_note(self.study, _identity.note(self.spec))
        elif not _identity.same_search(stored, wanted):
            budget_only = _identity.differs_only_in(
                stored, wanted, ("memory_budget_bytes", "headroom")
            )
            reused = (
                ": what it measured that still holds under the new budget is reused, not "
                "probed again"
                if budget_only
                else ", or repeat the original options"
            )
            raise StudyError(
                f"study {self.name!r} already holds a different search "
                f"({_identity.difference(stored, wanted)}); pass --study with a new name to "
                f"start another{reused}"
            )

    # ---- reading --------------------------------------------------------------------

    @transient_retry
    def next_round(self) -> int:
        """The number of a new round of interleaved confirmation runs."""
        made = [
            int(t.user_attrs[Attr.ROUND])
            for t in self.study.get_trials(deepcopy=False)
            if Attr.ROUND in t.user_attrs
        ]
        return 1 + max(made, default=-1)

    @transient_retry
    def records(self) -> list[TrialRecord]:
        """Every trial with a result: measured, or skipped because an OOM implies it.

        Confirmation runs are pooled into the trial they confirm; redundant proposals
        (pruned), running and interrupted trials are left out."""
        finished = [
            t
            for t in self.study.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)
            )
            if Attr.RESULT in t.user_attrs
        ]
        confirmations: dict[int, list[TrialResult]] = {}
        rounds: dict[int, list[tuple[int, float]]] = {}
        for trial in finished:
            if Attr.CONFIRMS in trial.user_attrs:
                with self._readable(f"trial {trial.number}'s result"):
                    confirmed = int(trial.user_attrs[Attr.CONFIRMS])
                    run = TrialResult.from_json(trial.user_attrs[Attr.RESULT])
                    round_made = int(trial.user_attrs.get(Attr.ROUND, -1))
                confirmations.setdefault(confirmed, []).append(run)
                step_s = quiet_step_s(run) if run.outcome == Outcome.OK else None
                if Attr.ROUND in trial.user_attrs and step_s:
                    rounds.setdefault(confirmed, []).append((round_made, step_s))
        state = self.parity()
        rehearsed = self.rehearsals()
        found = []
        for trial in finished:
            if Attr.CONFIRMS in trial.user_attrs:
                continue
            extra = confirmations.get(trial.number, [])
            with self._readable(f"trial {trial.number}'s result"):
                first = TrialResult.from_json(trial.user_attrs[Attr.RESULT])
                candidate = candidate_of(self.spec.space, trial.params)
            found.append(
                TrialRecord(
                    trial.number,
                    candidate,
                    combine(first, extra),
                    sum(run.pooled_runs for run in pooled(first, extra)),
                    state.verdict(candidate) if state else None,
                    rehearsal=rehearsed.get(trial.number),
                    rounds=tuple(sorted(rounds.get(trial.number, []))),
                )
            )
        return _coordination.one_per_config(found)

    @transient_retry
    def parity(self) -> ParityState | None:
        """The study's parity runs and verdicts (None before any parity run)."""
        raw = self.study.user_attrs.get(StudyAttr.PARITY)
        with self._readable("its parity runs"):
            return ParityState.from_json(raw) if raw else None

    @transient_retry
    def save_parity(self, state: ParityState) -> None:
        self.study.set_user_attr(StudyAttr.PARITY, state.to_json())

    @transient_retry
    def objective(self) -> Objective:
        """What the study's last search selected by (throughput for one stored before the
        objective was kept): show, export, report and autotune.load select by it too."""
        with self._readable("its objective"):
            return Objective(self.study.user_attrs.get(StudyAttr.OBJECTIVE, Objective.THROUGHPUT))

    @transient_retry
    def save_objective(self, objective: Objective) -> None:
        self.study.set_user_attr(StudyAttr.OBJECTIVE, str(objective))

    @transient_retry
    def rehearses(self) -> bool:
        """Whether the study's last search rehearsed the config to export (True unless
        it was told --no-rehearse): export, show and load gate on it as it did."""
        return bool(self.study.user_attrs.get(StudyAttr.REHEARSE, True))

    @transient_retry
    def save_rehearse(self, rehearse: bool) -> None:
        self.study.set_user_attr(StudyAttr.REHEARSE, rehearse)

    @transient_retry
    def rehearsals(self) -> dict[int, Rehearsal]:
        """The study's rehearsals, by the trial rehearsed."""
        raw = self.study.user_attrs.get(StudyAttr.REHEARSALS, {})
        with self._readable("its rehearsals"):
            return {int(n): Rehearsal.from_json(text) for n, text in raw.items()}

    @transient_retry
    def save_rehearsal(self, number: int, rehearsal: Rehearsal) -> None:
        """Keep a trial's rehearsal in the study (show and a rerun read it)."""
        raw = dict(self.study.user_attrs.get(StudyAttr.REHEARSALS, {}))
        raw[str(number)] = rehearsal.to_json()
        self.study.set_user_attr(StudyAttr.REHEARSALS, raw)

    @transient_retry
    def parity_plan(self) -> ParityPlan | None:
        """The parity runs' length --parity auto planned for this study, if it has."""
        raw = self.study.user_attrs.get(StudyAttr.PARITY_PLAN)
        with self._readable("its parity plan"):
            return ParityPlan.from_json(raw) if raw else None

    @transient_retry
    def save_parity_plan(self, plan: ParityPlan) -> ParityPlan:
        """Keep `plan` unless the study has one (another worker's): returns the kept."""
        kept = self.parity_plan()
        if kept is None:
            self.study.set_user_attr(StudyAttr.PARITY_PLAN, plan.to_json())
        return kept or plan

    @transient_retry
    def in_flight(self, exclude: int = -1) -> dict[Candidate, int]:
        """Configs being probed now (by any worker): config -> trial number."""
        return {
            candidate_of(self.spec.space, t.params): t.number
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if Attr.CLAIM in t.user_attrs and t.number != exclude
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

    # ---- the queue ------------------------------------------------------------------

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
        through a lock file beside the database."""
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
            self._add_finished(candidate, kept, judge(kept))
            path.unlink(missing_ok=True)

        return record

    # ---- writing results ------------------------------------------------------------

    @transient_retry
    def tell(self, asked: Asked, result: TrialResult, verdict: Verdict) -> bool:
        """Record a result on the trial (user attributes) and tell the sampler.

        False when the trial was already finished: another worker took it over (its
        heartbeat lapsed while the storage was away) and re-queued its config."""
        trial, candidate = asked.trial, asked.candidate
        try:
            for key, value in self._attributes(candidate, result, verdict).items():
                trial.set_user_attr(key, value)
            if verdict.constraint_gib is not None:
                trial.set_constraint(CONSTRAINT_NAME, verdict.constraint_gib)
            if verdict.values is not None:
                self.study.tell(trial, list(verdict.values))
            else:
                state = TrialState.PRUNED if verdict.pruned else TrialState.FAIL
                self.study.tell(trial, state=state)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as exc:
            if not _already_finished(exc):
                raise
            return False
        return True

    def take_over(
        self, found: Mapping[Candidate, TrialResult], judge: Callable[[TrialResult], Verdict]
    ) -> list[tuple[int, Candidate, TrialResult]]:
        """Record other studies' measurements of configs of this study's space that it has
        neither measured nor is probing, each as a finished trial of its own: (number,
        config, result). (Another study may have searched other optimizers, or another
        global batch: those configs are not this study's.)

        Added, not asked for: neither the queue's order nor the sampler decides what is
        taken over, and the sampler learns from all of it before its first proposal. On
        SQLite under the ask lock, so two workers starting together add each once."""
        taken = []
        with _coordination.sqlite_turn(self.url):
            # running first (claimed or only asked for), so a probe that ends meanwhile
            # is seen in the records; on a server without the lock, records() keeps one
            # record per config where two workers still raced
            running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            known = {candidate_of(self.spec.space, t.params) for t in running}
            known |= {r.candidate for r in self.records()}
            space = set(self.spec.space.candidates())
            for candidate, result in found.items():
                if candidate in space and candidate not in known:
                    number = self._add_finished(candidate, result, judge(result))
                    taken.append((number, candidate, result))
        return taken

    @transient_retry
    def _add_finished(self, candidate: Candidate, result: TrialResult, verdict: Verdict) -> int:
        state = TrialState.COMPLETE if verdict.values is not None else TrialState.FAIL
        constraint = verdict.constraint_gib
        trial = optuna.trial.create_trial(
            params=candidate_params(candidate, self.spec.space),
            distributions=distributions(self.spec.space),
            values=list(verdict.values) if verdict.values is not None else None,
            state=state,
            user_attrs=self._attributes(candidate, result, verdict),
            constraints={CONSTRAINT_NAME: constraint} if constraint is not None else None,
        )
        made = self.storage.create_new_trial(
            compat.study_id(self.storage, self.study), template_trial=trial
        )
        return int(self.storage.get_trial_number_from_id(made))

    @transient_retry
    def fail_and_requeue(self, asked: Asked, why: str) -> None:
        """A trial stopped by its own search (Ctrl-C, a full disk): failed, config re-queued."""
        trial, candidate = asked.trial, asked.candidate
        try:
            trial.set_user_attr(Attr.OUTCOME, "error")
            trial.set_user_attr(Attr.REASON, f"{why}; re-queued")
            self.study.tell(trial, state=TrialState.FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as exc:
            if not _already_finished(exc):
                raise
            return  # another worker already failed and re-queued it
        self.enqueue(candidate)  # retried on its own: a lost re-queue would lose the config

    @transient_retry
    def add_confirmation(
        self,
        record: TrialRecord,
        result: TrialResult,
        verdict: Verdict,
        folder: str,
        round_number: int | None = None,
    ) -> None:
        """Store a confirmation run as a finished trial pointing at the trial it confirms
        (and the interleaved round it was made in, if any)."""
        values = verdict.values if result.outcome == Outcome.OK else None
        attrs: dict[Attr, Any] = {
            Attr.CONFIRMS: record.number,
            Attr.TRIAL_DIR: folder,
            Attr.OUTCOME: str(result.outcome),
            Attr.REASON: result.reason or f"confirms trial {record.number}",
            Attr.RESULT: result.to_json(),
            Attr.SAMPLES_PER_S: round(result.samples_per_s or 0.0, 3),
        }
        if round_number is not None:
            attrs[Attr.ROUND] = round_number
        self.study.add_trial(
            optuna.trial.create_trial(
                params=candidate_params(record.candidate, self.spec.space),
                distributions=distributions(self.spec.space),
                values=list(values) if values else None,
                state=TrialState.COMPLETE if values else TrialState.FAIL,
                user_attrs={str(k): v for k, v in attrs.items()},
            )
        )

    def _attributes(
        self, candidate: Candidate, result: TrialResult, verdict: Verdict
    ) -> dict[str, Any]:

        spec = self.spec
        attrs: dict[str, Any] = {
            Attr.OUTCOME: str(result.outcome),
            Attr.REASON: result.reason,
            Attr.RESULT: result.to_json(),
            Attr.ACCUMULATION: candidate.gradient_accumulation_steps,
            Attr.TRAINING_ARGUMENTS: study_arguments(spec, candidate),
        }
        if result.reused_from:
            attrs[Attr.REUSED] = result.reused_from
        if result.samples_per_s is not None:
            attrs[Attr.SAMPLES_PER_S] = round(result.samples_per_s, 3)
            attrs[Attr.TOKENS_PER_S] = round(result.tokens_per_s or 0.0, 1)
            attrs[Attr.STEP_TIME_MEDIAN_S] = round(result.step_time_median_s or 0.0, 5)
            attrs[Attr.STEP_TIME_SPREAD_PCT] = round(100 * (result.step_time_spread or 0.0), 2)
        if result.peak_memory_bytes is not None:
            attrs[Attr.PEAK_MEMORY_GIB] = round(result.peak_memory_bytes / GIB, 3)
            attrs[Attr.BUDGET_USED_PCT] = round(
                100 * result.peak_memory_bytes / spec.memory_budget_bytes, 1
            )
        if verdict.constraint_gib is not None:
            attrs[Attr.CONSTRAINT_GIB] = verdict.constraint_gib
        return {str(k): v for k, v in attrs.items()}

    def _readable(self, what: str) -> contextlib.AbstractContextManager[None]:
        return _readable(self.name, self.url, what)

    def _id(self, number: int) -> int:
        return compat.trial_id(self.storage, self.study, number)


class TrialLost(Exception):
    """The trial was finished by another worker (which judged it abandoned and re-queued
    its config): this worker drops it and asks again."""


@contextlib.contextmanager
def _lost_if_finished(trial: optuna.Trial) -> Iterator[None]:
    try:
        yield
    except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as exc:
        if not _already_finished(exc):
            raise
        raise TrialLost(f"trial {trial.number} was taken over by another worker") from None


def _already_finished(exc: BaseException) -> bool:
    """Optuna's ways of saying a trial is already finished: UpdateFinishedTrialError from
    an attribute write, ValueError("Cannot tell a FAIL trial.") from study.tell."""
    if isinstance(exc, optuna.exceptions.UpdateFinishedTrialError):
        return True
    return str(exc).startswith("Cannot tell a")


@contextlib.contextmanager
def _readable(name: str, url: str, what: str) -> Iterator[None]:
    """Decoding what a study holds: StudyError, naming the study and `what` of it cannot
    be read, where another version (or damage) left it in a shape this one cannot read."""
    try:
        yield
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        why = f"no {exc}" if isinstance(exc, KeyError) else first_line(exc)
        raise StudyError(
            f"study {name!r} in {mask(url)}: {what} cannot be read ({why}); another autotune "
            "version wrote it, or it is damaged: search it under another --study"
        ) from None
