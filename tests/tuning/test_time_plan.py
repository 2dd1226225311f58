"""The time budget plans the search: timed steps a probe, whether torch.compile is worth
probing, the parity runs' length; each choice said, and kept by the study."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import SPEC, cand, rec

from autotune.core.parity import CALIBRATED_STEPS
from autotune.core.parity_state import ParityPlan
from autotune.core.trial import TrialRecord
from autotune.core.units import format_duration
from autotune.store.samplers import make_sampler
from autotune.store.store import StudyStore
from autotune.tuning import exploring
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.tuning.run import SearchRun
from autotune.tuning.time_plan import (
    COLD_COMPILE_S,
    plan_for_budget,
    plan_parity,
)

COMPILING = dataclasses.replace(
    SPEC,
    space=dataclasses.replace(SPEC.space, levers=(("torch_compile", (False, True)),)),
    measure_steps=3,
)


def plan(spec: Any = COMPILING, budget_s: float = 300.0, **kw: Any) -> tuple[Any, list[str]]:
    asked = {"steps_asked": False, "compile_asked": False, **kw}
    return plan_for_budget(spec, budget_s=budget_s, explore_share=0.8, **asked)


def compile_values(spec: Any) -> tuple[Any, ...]:
    return dict(spec.space.levers)["torch_compile"]


def test_a_short_budget_leaves_out_a_compile_it_cannot_pay_for_and_says_why() -> None:
    """5 minutes explore 4: three cold compiles of about 1m30s would take over a third of
    it. Half an hour affords them. The lines say the budget, the steps and the reason."""
    short, said = plan(budget_s=300.0)
    assert compile_values(short) == (False,)
    assert said[0].startswith("time budget 5m00s: at most 3 timed steps a probe")
    assert "torch.compile left out by the time budget" in said[1]
    assert dict(short.space.not_offered)["torch_compile"].startswith("left out by the time")
    assert short.space.size == COMPILING.space.size // 2
    long, said = plan(budget_s=1800.0)
    assert compile_values(long) == (False, True) and len(said) == 1
    # The border: 3 compiles within a third of the time to explore.
    border = 3 * COLD_COMPILE_S["cpu"] * 3 / 0.8
    assert compile_values(plan(budget_s=border + 1)[0]) == (False, True)
    assert compile_values(plan(budget_s=border - 1)[0]) == (False,)


def test_what_the_user_set_is_not_replanned() -> None:
    spec, said = plan(budget_s=300.0, compile_asked=True, steps_asked=True)
    assert compile_values(spec) == (False, True)
    assert said == ["time budget 5m00s: at most 3 timed steps a probe"]
    _, said = plan(budget_s=300.0, default_budget=True)
    assert said[0].startswith("time budget 5m00s (a default: set --time-budget)")


def test_a_resumed_study_keeps_its_plan_whatever_the_new_budget() -> None:
    """Rerun with a longer budget, a study planned at 5 minutes keeps 3 timed steps and
    compile left out: its figures stay comparable and its identity holds."""
    stored, _ = plan(budget_s=300.0)
    rerun = dataclasses.replace(COMPILING, measure_steps=5)
    kept, said = plan(rerun, budget_s=1800.0, stored=stored)
    assert kept.identity() == stored.identity()
    assert said == ["resumed: the study's plan stands (at most 3 timed steps a probe)"]
    # Another search under the same name is not made to match: the store refuses it.
    other = dataclasses.replace(rerun, seq_len=64)
    replanned, _ = plan(other, budget_s=1800.0, stored=stored)
    assert replanned.identity() != stored.identity()


def timed(number: int, candidate: Any, step_s: float, wall_s: float = 30.0) -> TrialRecord:
    r = rec(number, candidate, sps=64 / step_s)
    phases = {"total": 10.0 + 4.0, "train": 10.0, "wall": wall_s}
    result = r.result.replace(step_time_median_s=step_s, one_time_s=1.0, phases_s=phases)
    return dataclasses.replace(r, result=result)


def parity_plan(records: list[TrialRecord], left: float | None) -> ParityPlan | None:
    return plan_parity(SPEC, records, top=3, explore_left_s=left, elapsed_s=60.0, explore_share=0.8)


def test_parity_runs_of_20_steps_where_they_fit_half_the_time_left_else_quick_checks() -> None:
    """The recipe (fp32 AdamW) and its twin at the slowest measured step (2 s), the one
    other arithmetic (bf16) at the quickest (1 s); each child 4 s to start and 1 s of
    one-time cost; the held-out evaluations in fp32, at the slowest's step."""
    records = [timed(0, cand(64), 2.0), timed(1, cand(64, "bf16"), 1.0)]
    assert parity_plan([], 1000.0) is None  # nothing measured: nothing to time them by
    assert parity_plan(records[:1], 1000.0) is None  # until both first guesses are in
    final = plan_parity(
        SPEC,
        records[:1],
        top=3,
        explore_left_s=1000.0,
        elapsed_s=0.0,
        explore_share=0.8,
        final=True,
    )
    assert final is not None  # unless exploring is over

    def need(steps: int, evaluations: int) -> float:
        return 2 * (5.0 + steps * 2.0) + (5.0 + steps * 1.0) + 3 * evaluations * (16 / 64) / 3 * 2.0

    twenty = need(20, 11)  # evaluations at steps 0, 2, 4 ... 20
    roomy = parity_plan(records, 2 * twenty + 1)
    assert roomy is not None and (roomy.steps, roomy.quick) == (CALIBRATED_STEPS, False)
    assert "parity: 20-step runs, which verify (3 runs" in roomy.why
    tight = parity_plan(records, 2 * twenty - 1)
    assert tight is not None and (tight.steps, tight.quick) == (0, True)  # no runs
    assert "judged from the probes' own losses" in tight.why
    assert "exported only when paired rounds confirm it significantly faster" in tight.why
    afford = (60.0 + 2 * twenty) / 0.8
    assert f"a --time-budget of about {int(-(-afford // 60))}m00s affords them" in tight.why
    # without runs, the whole time left explores: probes at the mean wall time (30 s),
    # the last starting before exploring ends
    more = math.ceil((2 * twenty - 1) / 30)
    assert tight.why.startswith(f"about {more} more probes fit; parity: judged from the probes")


def test_one_config_measured_plans_no_runs_where_the_recipes_own_runs_cannot_fit() -> None:
    """Before the second first guess is measured, the plan waits, unless the recipe's two
    20-step runs alone, timed as the one config measured (45 s a run), already take over
    half the time left: no later measurement can shorten them, so no runs, at once. A
    one-minute search otherwise spent its second probe of two on a bf16 guess that it
    could never confirm, and so never export."""
    recipe = [timed(0, cand(64), 2.0)]
    floor = 2 * (5.0 + 20 * 2.0)
    assert parity_plan(recipe, 2 * floor + 1) is None  # they may fit: the finalists decide
    short = parity_plan(recipe, 2 * floor - 1)
    assert short is not None and (short.steps, short.quick) == (0, True)
    assert "judged from the probes' own losses" in short.why
    # the whole plan it names: the finalist's run and the evaluations timed as the recipe's
    whole = floor + 45.0 + 3 * 11 * (16 / 64) / 3 * 2.0
    assert f"(3 runs, about {format_duration(whole)})" in short.why


def test_no_parity_plan_is_said_where_no_config_changes_the_recipes_arithmetic() -> None:
    fp32_only = dataclasses.replace(
        SPEC, space=dataclasses.replace(SPEC.space, precisions=("fp32",))
    )
    records = [timed(0, cand(64), 2.0), timed(1, cand(32), 3.0)]
    got = plan_parity(
        fp32_only, records, top=3, explore_left_s=10.0, elapsed_s=0.0, explore_share=0.8
    )
    assert got is not None and got.why == ""


def test_the_parity_plan_is_kept_by_the_study_for_workers_and_reruns(tmp_path: Path) -> None:
    """The first searching process to plan stores it; another (a worker, a rerun with
    more time) takes the stored plan instead of planning anew, and says so."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    store = StudyStore.open(url=url, name="plan", spec=SPEC, sampler=make_sampler("tpe", 0))
    records = [timed(0, cand(64), 2.0), timed(1, cand(64, "bf16"), 1.0)]
    said: list[str] = []
    observer = SimpleNamespace(on_plan=said.append)

    def search() -> SearchRun:
        limits = SearchLimits(parity_steps=CALIBRATED_STEPS, parity_auto=True)
        return SearchRun(
            store=store,
            study_dir=tmp_path,
            limits=limits,  # type: ignore[arg-type]
            observer=observer,
            launcher=None,
        )  # type: ignore[arg-type]

    first = search()
    exploring.plan_parity(first, Deadline.after(30.0), [])
    assert first.limits.parity_auto and store.settings.parity_plan() is None  # nothing measured yet
    exploring.plan_parity(first, Deadline.after(30.0), records)
    assert (first.limits.parity_steps, first.limits.parity_quick) == (0, True)
    assert not first.limits.parity_auto and store.settings.parity_plan() is not None
    rerun = search()
    exploring.plan_parity(rerun, Deadline.after(10_000.0), records)  # would afford 20 steps itself
    assert (rerun.limits.parity_steps, rerun.limits.parity_quick) == (0, True)
    assert said[-1] == "parity: the probes' own losses, unverified, as this study planned"
    assert store.settings.save_parity_plan(ParityPlan(20, False, "")).steps == 0


@pytest.mark.parametrize(
    ("budget", "steps"),
    [("1m", 2), ("2m59s", 2), ("3m", 3), ("5m", 3), ("9m59s", 3), ("10m", 5), (None, 5)],
)
def test_the_timed_steps_follow_the_time_budget_or_its_default(
    budget: str | None, steps: int
) -> None:
    from autotune.core.units import parse_duration
    from autotune.tuning.options import SearchOptions
    from autotune.tuning.time_plan import measure_steps_for

    options = SearchOptions(model="tiny", time_budget=parse_duration(budget) if budget else None)
    assert measure_steps_for(options.budget_s) == steps
