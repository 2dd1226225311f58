"""Why a search stops proposing: --max-trials, the time budget, an exhausted space.

The time budget is checked with a fake clock: no sleeping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import SPEC, cand, rec

from autotune.search.deadline import Deadline
from autotune.search.run import SearchLimits, SearchRun
from autotune.search.skips import NO_ESTIMATE


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(limits: SearchLimits) -> SearchRun:
    store: Any = type("FakeStore", (), {"spec": SPEC})()
    return SearchRun(store=store, study_dir=Path("unused"), limits=limits, observer=None,  # type: ignore[arg-type]
                     launcher=None)  # type: ignore[arg-type]  # fmt: skip


never_over = NO_ESTIMATE


def test_the_time_budget_stops_new_probes_at_its_search_share() -> None:
    clock = Clock()
    budget = Deadline.after(100.0, clock)
    explore = budget.share(0.8)  # the rest is for confirming the finalists
    search = run(SearchLimits(max_trials=50, confirm_top=3))
    recs = [rec(0, cand(8))]
    clock.now += 79
    assert search._stop_reason(recs, {}, explore, never_over) == ""
    clock.now += 2
    assert search._stop_reason(recs, {}, explore, never_over).startswith("time budget spent")
    assert not budget.passed() and budget.left() == 19.0  # confirmation still has its time


def test_max_trials_counts_probes_running_elsewhere_but_not_skips() -> None:
    from autotune.core.enums import Outcome

    search = run(SearchLimits(max_trials=3))
    recs = [rec(0, cand(8)), rec(1, cand(16), Outcome.SKIPPED)]
    no_deadline = Deadline.after(None)
    assert search._stop_reason(recs, {cand(32): 5}, no_deadline, never_over) == ""
    busy = {cand(32): 5, cand(64): 6}
    assert search._stop_reason(recs, busy, no_deadline, never_over) == "reached --max-trials 3"


def test_a_trial_taken_over_between_ask_and_claim_is_dropped_unprobed(tmp_path: Path) -> None:
    """Another worker failed the trial (judging it abandoned) and re-queued its config:
    this worker neither probes it nor stops, and the config stays in the queue."""
    from optuna.trial import TrialState

    from autotune.store.samplers import make_sampler
    from autotune.store.store import StudyStore

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    store = StudyStore.open(url=url, name="lost", spec=SPEC, sampler=make_sampler("tpe", 0))
    store.enqueue(cand(8))
    asked = store.ask()

    def ask_then_lose() -> Any:
        store.study.tell(asked[0].number, state=TrialState.FAIL)  # as a rival's recovery does
        store.enqueue(cand(8))
        return asked

    store.ask = ask_then_lose  # type: ignore[method-assign]
    launcher: Any = type("NoLaunch", (), {"run": lambda *a, **k: pytest.fail("probed")})()
    search = SearchRun(store=store, study_dir=tmp_path, limits=SearchLimits(), observer=None,  # type: ignore[arg-type]
                       launcher=launcher)  # fmt: skip
    search._step([], {}, never_over)
    assert search.probes == 0
    waiting = store.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert len(waiting) == 1


def test_time_spent_on_parity_runs_does_not_eat_the_confirmation_share() -> None:
    clock = Clock()
    budget = Deadline.after(100.0, clock)
    clock.now += 85  # exploring stopped at 80; 15 s are left for confirmation
    clock.now += 40  # parity runs
    moved = budget.later(40)
    assert budget.passed() and not moved.passed() and moved.left() == 15.0
    assert Deadline.after(None, clock).later(40).left() is None
