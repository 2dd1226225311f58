"""What bounds a search and who hears of its progress: the limits a search runs under
(`SearchLimits`, built once from the options) and the protocol its observer (the
progress view) implements. Plain values, so views and workers read them without
importing the study loop."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from autotune.core.enums import Objective
from autotune.core.parity_verdict import Parity
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialResult


@dataclasses.dataclass(frozen=True)
class SearchLimits:
    max_trials: int = 20  # probes launched in the whole study (resumes count earlier ones)
    trial_timeout_s: float = 600.0
    confirm_top: int = 3  # finalists measured again before selection (0: none)
    confirm_steps: int = 10  # measured steps of a confirmation run
    # paired rounds at most between the two finalists the export hinges on (tuning/confirming.duel)
    confirm_rounds: int = 8
    # With confirmation on, exploring stops at this share of the time budget.
    search_share: float = 0.8
    fork_server: bool = True  # children forked from a pre-imported server
    # How many probes share this machine's cores at a time (--parallel on the CPU);
    # recorded with each result, so figures measured side by side are told apart.
    concurrent: int = 1
    poll_s: float = 2.0  # how often a worker waiting on other workers' trials looks again
    # Whether the finalists' parity is judged (--parity other than off): by parity runs
    # of parity_steps steps, or, where that is 0, from the probes' own losses
    parity_check: bool = False
    parity_steps: int = 0
    # --parity quick: a verdict too short to verify (core/parity.py) may be exported
    parity_quick: bool = False
    # --parity auto: parity_steps and parity_quick are planned once the first guesses
    # are measured (tuning/time_plan.plan_parity), and kept in the study
    parity_auto: bool = False
    # Finalists whose arithmetic parity settles, when not confirm_top (a worker confirms
    # none; its parent settles its top confirm_top, and the worker leaves them time)
    parity_top: int | None = None
    objective: Objective = Objective.THROUGHPUT  # what selection (and so parity) ranks by
    # Explore probes warm up until steady and stop once rankable against the best so far
    # (core/schedule.py; CPU); False: every probe runs --warmup-steps + --measure-steps
    adaptive: bool = True
    # A config another study in the storage measured alike is not probed again
    reuse: bool = True
    # --sampler model: an additive model of step time proposes, and may stop the search
    propose: bool = False
    # Before the export, the selected config rehearses the run's evaluation and checkpoint
    # save under the budget (tuning/rehearsal.py)
    rehearse: bool = False


class Observer(Protocol):
    def on_search_start(
        self, spec: SearchSpec, study_name: str, limits: SearchLimits, done: int
    ) -> None: ...
    def on_trial_start(self, number: int, candidate: Candidate) -> None: ...
    def on_trial_end(self, number: int, candidate: Candidate, result: TrialResult) -> None: ...
    def on_confirm(self, number: int, candidate: Candidate, result: TrialResult) -> None: ...
    def on_parity_start(self, label: str, candidate: Candidate) -> None: ...
    def on_parity_reused(self, study: str, runs: list[str]) -> None: ...
    def on_parity(self, candidate: Candidate, parity: Parity) -> None: ...
    def on_plan(self, line: str) -> None: ...
