"""What a study keeps besides its trials, as study attributes: the parity runs and their
verdicts, the parity plan, the objective it selects by, whether it rehearses the export,
and its rehearsals. `StudyStore.settings` is one."""

from __future__ import annotations

import optuna

from autotune.core.enums import Objective
from autotune.core.parity_state import ParityPlan, ParityState
from autotune.core.rehearsal import Rehearsal
from autotune.store._retry import transient_retry
from autotune.store.keys import StudyAttr
from autotune.store.storage import readable


class StudySettings:
    """The study's own attributes, read and kept (every call retries a storage away)."""

    def __init__(self, study: optuna.Study, url: str) -> None:
        self.study = study
        self.url = url

    @property
    def name(self) -> str:
        return self.study.study_name

    @transient_retry
    def parity(self) -> ParityState | None:
        """The study's parity runs and verdicts (None before any parity run)."""
        raw = self.study.user_attrs.get(StudyAttr.PARITY)
        with readable(self.name, self.url, "its parity runs"):
            return ParityState.from_json(raw) if raw else None

    @transient_retry
    def save_parity(self, state: ParityState) -> None:
        self.study.set_user_attr(StudyAttr.PARITY, state.to_json())

    @transient_retry
    def objective(self) -> Objective:
        """What the study's last search selected by (throughput for one stored before the
        objective was kept): show, export, report and autotune.load select by it too."""
        with readable(self.name, self.url, "its objective"):
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
        with readable(self.name, self.url, "its rehearsals"):
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
        with readable(self.name, self.url, "its parity plan"):
            return ParityPlan.from_json(raw) if raw else None

    @transient_retry
    def save_parity_plan(self, plan: ParityPlan) -> ParityPlan:
        """Keep `plan` unless the study has one (another worker's): returns the kept."""
        kept = self.parity_plan()
        if kept is None:
            self.study.set_user_attr(StudyAttr.PARITY_PLAN, plan.to_json())
        return kept or plan
