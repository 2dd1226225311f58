"""StudyStore: one search's study in an Optuna storage. With its parts (`queue`: the
workers' queue and claims; `settings`: the study's own attributes) the only code that
reads or writes Optuna trials; the search decides, the store records.

Figures and the outcome are user attributes with units in their names; the study's
values are (samples/s, peak memory GiB) with the budget as a constraint, so
optuna-dashboard shows the Pareto front.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from autotune.core.enums import Outcome
from autotune.core.errors import StudyError
from autotune.core.spec import SearchSpec
from autotune.core.stats import combine, pooled, quiet_step_s
from autotune.core.trial import Candidate, TrialRecord, TrialResult, Verdict
from autotune.hf.training_args import study_arguments  # pure: imports no transformers
from autotune.store import _coordination, _identity, compat
from autotune.store._params import candidate_of, candidate_params, distributions, has_candidate
from autotune.store._retry import transient_retry
from autotune.store._settings import StudySettings
from autotune.store.keys import CONSTRAINT_NAME, Attr, StudyAttr
from autotune.store.queue import Asked, StudyQueue, already_finished
from autotune.store.storage import (
    first_line,
    heartbeat_s,
    mask,
    open_storage,
    patience_s,
    quiet_optuna,
    readable,
    storage_file,
)

GIB = float(2**30)


class StudyStore:
    """A study, its storage and its spec; built by `open` (search) or `load` (review)."""

    def __init__(
        self, study: optuna.Study, storage: BaseStorage, url: str, spec: SearchSpec
    ) -> None:
        self.study = study
        self.storage = storage
        self.url = url
        self.spec = spec
        # its parts: the workers' queue and claims, and the study's own attributes
        self.queue = StudyQueue(study, storage, url, spec, self._add_finished)
        self.settings = StudySettings(study, url)

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
        _identity.check(study, spec)
        return store

    @classmethod
    def load(cls, *, url: str, name: str) -> StudyStore:
        """An existing study and the spec it was created with (for export and review)."""
        quiet_optuna()
        heartbeat_s()  # the environment's settings are refused first, as by a search
        patience_s()
        path = storage_file(url)
        if path is not None and not path.exists():  # a review creates no file
            raise StudyError(
                f"no study named {name!r}: {path} does not exist; run `autotune search` "
                "first or check --storage"
            )
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
        with readable(name, url, "its search spec"):
            spec = SearchSpec.from_json(raw)
        return cls(study, storage, url, spec)

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
                with readable(self.name, self.url, f"trial {trial.number}'s result"):
                    confirmed = int(trial.user_attrs[Attr.CONFIRMS])
                    run = TrialResult.from_json(trial.user_attrs[Attr.RESULT])
                    round_made = int(trial.user_attrs.get(Attr.ROUND, -1))
                confirmations.setdefault(confirmed, []).append(run)
                step_s = quiet_step_s(run) if run.outcome == Outcome.OK else None
                if Attr.ROUND in trial.user_attrs and step_s:
                    rounds.setdefault(confirmed, []).append((round_made, step_s))
        state = self.settings.parity()
        rehearsed = self.settings.rehearsals()
        found = []
        for trial in finished:
            if Attr.CONFIRMS in trial.user_attrs:
                continue
            extra = confirmations.get(trial.number, [])
            with readable(self.name, self.url, f"trial {trial.number}'s result"):
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

    # ---- writing results ------------------------------------------------------------

    @transient_retry
    def tell(self, asked: Asked, result: TrialResult, verdict: Verdict) -> bool:
        """Record a result on the trial (user attributes) and tell the sampler.

        False when the trial was already finished: another worker took it over (its
        heartbeat lapsed while the storage was away) and re-queued its config."""
        trial, candidate = asked.trial, asked.candidate
        try:
            for key, value in trial_attributes(self.spec, candidate, result, verdict).items():
                trial.set_user_attr(key, value)
            if verdict.constraint_gib is not None:
                trial.set_constraint(CONSTRAINT_NAME, verdict.constraint_gib)
            if verdict.values is not None:
                self.study.tell(trial, list(verdict.values))
            else:
                state = TrialState.PRUNED if verdict.pruned else TrialState.FAIL
                self.study.tell(trial, state=state)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as exc:
            if not already_finished(exc):
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
            known = self._known()
            space = set(self.spec.space.candidates())
            for candidate, result in found.items():
                if candidate in space and candidate not in known:
                    number = self._add_finished(candidate, result, judge(result))
                    taken.append((number, candidate, result))
        return taken

    @transient_retry
    def _known(self) -> set[Candidate]:
        """Configs this study has measured or is probing. Running first (claimed or only
        asked for), so a probe that ends meanwhile is seen in the records; on a server
        without the ask lock, records() keeps one record per config where two workers
        still raced."""
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        known = {
            candidate_of(self.spec.space, t.params) for t in running if has_candidate(t.params)
        }
        return known | {r.candidate for r in self.records()}

    @transient_retry
    def _add_finished(self, candidate: Candidate, result: TrialResult, verdict: Verdict) -> int:
        state = TrialState.COMPLETE if verdict.values is not None else TrialState.FAIL
        constraint = verdict.constraint_gib
        trial = optuna.trial.create_trial(
            params=candidate_params(candidate, self.spec.space),
            distributions=distributions(self.spec.space),
            values=list(verdict.values) if verdict.values is not None else None,
            state=state,
            user_attrs=trial_attributes(self.spec, candidate, result, verdict),
            constraints={CONSTRAINT_NAME: constraint} if constraint is not None else None,
        )
        made = self.storage.create_new_trial(
            compat.study_id(self.storage, self.study), template_trial=trial
        )
        return int(self.storage.get_trial_number_from_id(made))

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


def stored_spec(*, url: str, name: str) -> SearchSpec | None:
    """The spec a study of this name was made with; None when there is none yet (a
    SQLite file that does not exist is not created)."""
    path = storage_file(url)
    if path is not None and not path.exists():
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
    with readable(name, url, "its search spec"):
        return SearchSpec.from_json(raw) if raw else None


def trial_attributes(
    spec: SearchSpec, candidate: Candidate, result: TrialResult, verdict: Verdict
) -> dict[str, Any]:
    """A trial's user attributes: its outcome, result and figures, with units in their
    names (optuna-dashboard shows them)."""
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
