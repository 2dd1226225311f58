"""The time budget drives the plan: how long a probe measures, whether a lever whose
one-time cost the budget cannot pay back is probed at all, and how long the parity runs
are. Each choice is said in the search's first lines, with its reason.

Before the first probe, from the budget alone (`plan_for_budget`):
- Timed steps a probe: at most 2 under `TINY_BUDGET_S` (a warm-up step and two whole
  steps, never part of one), 3 under `SHORT_BUDGET_S`, else 5 (`--measure-steps`
  overrides). On the CPU the timer stops earlier anyway once a config is clearly slower
  or its band is tight; a short budget buys more probes with the steps saved. Fewer
  steps say less: two steps' interval is their whole range (`core/stats`), and a change
  of arithmetic read on them is still exported only on paired rounds.
- torch.compile: each compiled probe pays a cold compile in its own cache (about 60-115 s
  a probe on this 2-core CPU for gpt2 and mt5-small, 25-35 s for a 25M-parameter model,
  56 s for mt5-small on an H100: benchmarks/RESULTS.md). Whether compiling pays is
  known only after `COMPILE_PROBES` compiled probes of the best family; when those
  would take more than `COMPILE_SHARE` of the time to explore, compile is left out.
  Compiling fixed by `--lever` or by `--base-args` decides instead.
A study resumed keeps the plan it was made with (its probes' figures stay comparable,
and its identity holds).

Once the first guesses are measured (two configs that fit; `plan_parity`, for `--parity
auto`), or sooner where the first already rules them out: the parity runs' length. 20
steps verify a verdict (core/parity.CALIBRATED_STEPS); they are planned when the runs
they need (your recipe, its other batch split, a run per finalist arithmetic) take at
most `PARITY_SHARE` of the time left to explore; else no runs: the probes' own losses
judge (core/parity.judge_probes), which can only say `unverified`, and the whole budget
explores. Without runs, and without time for the paired rounds that confirm a change
(`stopping.change_unconfirmable`), exploring probes only configs that keep your arithmetic.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from autotune.core.enums import DeviceKind
from autotune.core.levers import TORCH_COMPILE
from autotune.core.parity import CALIBRATED_STEPS, Arithmetic
from autotune.core.parity_state import ParityPlan
from autotune.core.space import SearchSpace
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialRecord
from autotune.core.units import format_duration
from autotune.tuning.parity import evaluation_s, reference_candidate, run_s
from autotune.tuning.selection import fitting

TINY_BUDGET_S = 3 * 60.0
TINY_MEASURE_STEPS = 2
SHORT_BUDGET_S = 10 * 60.0
SHORT_MEASURE_STEPS = 3
MEASURE_STEPS = 5
# What one cold compile costs a probe, planned with (measured: see the module docstring)
COLD_COMPILE_S = {DeviceKind.CPU: 90.0, DeviceKind.CUDA: 60.0}
COMPILE_PROBES = 3
COMPILE_SHARE = 1 / 3
PARITY_SHARE = 0.5  # parity runs may take at most half of what is left to explore
MEASURED_TO_PLAN = 2  # configs that fit, measured before the parity runs are planned


def measure_steps_for(budget_s: float) -> int:
    if budget_s < TINY_BUDGET_S:
        return TINY_MEASURE_STEPS
    return SHORT_MEASURE_STEPS if budget_s < SHORT_BUDGET_S else MEASURE_STEPS


def plan_for_budget(
    spec: SearchSpec,
    *,
    budget_s: float,
    explore_share: float,
    steps_asked: bool,
    compile_asked: bool,
    stored: SearchSpec | None = None,
    default_budget: bool = False,
) -> tuple[SearchSpec, list[str]]:
    """The spec with the levers this budget affords, and the lines that say what the
    plan is and why. `steps_asked`, `compile_asked`: the user set --measure-steps, or
    torch.compile (the budget decides neither then); `stored`: the study resumed, whose
    plan stands where the rest of the search is the same; `default_budget`: the budget
    is the default, not the user's."""
    if stored is not None:
        kept = dataclasses.replace(
            spec,
            measure_steps=spec.measure_steps if steps_asked else stored.measure_steps,
            space=spec.space if compile_asked else stored.space,
        )
        if kept.identity() == stored.identity():
            return kept, [f"resumed: the study's plan stands ({_steps_line(kept)})"]
    default = " (a default: set --time-budget)" if default_budget else ""
    said = [f"time budget {format_duration(budget_s)}{default}: {_steps_line(spec)}"]
    if not steps_asked:
        said[0] += f" ({_tiers()})"
    compile_values = dict(spec.space.levers).get(TORCH_COMPILE.name, ())
    if not compile_asked and len(compile_values) > 1:
        cost = COLD_COMPILE_S[spec.device.kind]
        explore_s = budget_s * explore_share
        if COMPILE_PROBES * cost > COMPILE_SHARE * explore_s:
            why = (
                f"left out by the time budget: a cold compile costs about "
                f"{format_duration(cost)} a probe, and the {COMPILE_PROBES} compiled probes "
                f"that tell whether it pays back would take over a third of the "
                f"{format_duration(explore_s)} to explore"
            )
            fixed = _fixed(spec, TORCH_COMPILE.name, False, why)
            spec = dataclasses.replace(spec, space=fixed)
            said.append(f"torch.compile {why} (--lever {TORCH_COMPILE.name}=false,true probes it)")
    return spec, said


def _tiers() -> str:
    return (
        f"{TINY_MEASURE_STEPS} under {format_duration(TINY_BUDGET_S)}, {SHORT_MEASURE_STEPS} "
        f"under {format_duration(SHORT_BUDGET_S)}, {MEASURE_STEPS} from there up"
    )


def _steps_line(spec: SearchSpec) -> str:
    return f"at most {spec.measure_steps} timed steps a probe"


def _fixed(spec: SearchSpec, lever: str, value: object, why: str) -> SearchSpace:
    space = spec.space
    levers = tuple((n, (value,) if n == lever else v) for n, v in space.levers)
    return dataclasses.replace(space, levers=levers, not_offered=(*space.not_offered, (lever, why)))


def plan_parity(
    spec: SearchSpec,
    records: Sequence[TrialRecord],
    *,
    top: int,
    explore_left_s: float | None,
    elapsed_s: float,
    explore_share: float,
    final: bool = False,
) -> ParityPlan | None:
    """--parity auto: 20-step runs where the budget affords them, else none (steps 0:
    the probes' own losses judge).
    None until `MEASURED_TO_PLAN` configs that fit are measured (the search's first
    guesses: the plain default and the fast guess), unless `final` (exploring is over),
    or unless one already rules 20-step runs out: your recipe's two runs alone, timed as
    the slowest config so far (it only gets slower), take over the share of the time left
    (it only shrinks). A one-minute NeoX search spent its second probe of two on a bf16
    guess it could never export, then planned no runs.

    The runs: your recipe and its other batch split, each timed as the slowest config
    that fits would take (the plain default is among the first measured, so this errs
    long), and one per finalist arithmetic (up to `top`, as many as the space holds
    besides the recipe's) timed as the quickest would. `elapsed_s`, `explore_share`: the
    search's time so far and the share of the budget that explores, for the budget that
    would afford 20 steps."""
    fits = fitting(records, spec.fit_limit_bytes)
    if not fits:
        return None
    recipe = Arithmetic.of(reference_candidate(spec, records))
    others = {Arithmetic.of(c) for c in _corners(spec)} - {recipe}
    if not others:  # no config changes the recipe's arithmetic: nothing to run
        return ParityPlan(CALIBRATED_STEPS, quick=False, why="")
    finalists = min(max(1, top), len(others))
    processes = spec.processes
    by_run = sorted((r.result for r in fits), key=lambda r: run_s(r, CALIBRATED_STEPS, processes))
    slowest, quickest = by_run[-1], by_run[0]

    def need(steps: int) -> float:  # the held-out evaluations run in fp32: the slowest's
        evaluations = (2 + finalists) * evaluation_s(spec, steps, slowest)
        return (
            2 * run_s(slowest, steps, processes)
            + finalists * run_s(quickest, steps, processes)
            + evaluations
        )

    runs = f"{2 + finalists} runs"
    early = len(fits) < MEASURED_TO_PLAN and not final  # the first guesses still to measure
    least = 2 * run_s(slowest, CALIBRATED_STEPS, processes) if early else need(CALIBRATED_STEPS)
    if explore_left_s is None or least <= PARITY_SHARE * explore_left_s:
        if early:  # the runs may fit: the finalists' arithmetic decides
            return None
        return ParityPlan(
            CALIBRATED_STEPS,
            quick=False,
            why=f"{_probes_left(records, explore_left_s, need(CALIBRATED_STEPS))}parity: "
            f"{CALIBRATED_STEPS}-step runs, which verify ({runs}, about "
            f"{format_duration(need(CALIBRATED_STEPS))})",
        )
    afford = (elapsed_s + need(CALIBRATED_STEPS) / PARITY_SHARE) / explore_share
    return _no_runs(records, explore_left_s, runs, need(CALIBRATED_STEPS), afford)


def _no_runs(
    records: Sequence[TrialRecord], explore_left_s: float, runs: str, need_s: float, afford: float
) -> ParityPlan:
    """The plan where 20-step runs do not fit: none, the probes' own losses judge, and
    the whole time left explores; said with the budget that would afford the runs."""
    return ParityPlan(
        0,
        quick=True,
        why=f"{_probes_left(records, explore_left_s, 0.0)}parity: judged from the probes' own "
        f"losses (the same batches from the same weights), which cannot verify: a change of "
        f"your precision or optimizer is exported only when paired rounds confirm it "
        f"significantly faster, marked unverified. {CALIBRATED_STEPS}-step runs ({runs}, about "
        f"{format_duration(need_s)}) would take over half of the "
        f"{format_duration(explore_left_s)} left to explore; a --time-budget of about "
        f"{format_duration(60 * math.ceil(afford / 60))} affords them",
    )


def _probes_left(
    records: Sequence[TrialRecord], explore_left_s: float | None, reserve_s: float
) -> str:
    """'about N more probes; ' that start in the time left to explore beside the parity
    runs, at the mean wall time of the probes so far ('' without a budget): a probe may
    start until exploring ends, as long as it ends within the whole budget (a search
    here said 'about 0 more' with 14 s left to explore, then ran a 14 s probe)."""
    walls = [w for r in records if (w := r.result.phases_s.get("wall", 0.0)) > 0]
    if explore_left_s is None or not walls:
        return ""
    more = max(0, math.ceil((explore_left_s - reserve_s) / (sum(walls) / len(walls))))
    return f"about {more} more probes fit; "


def _corners(spec: SearchSpec) -> list[Candidate]:
    """One candidate per precision and optimizer of the space."""
    batch = spec.space.micro_batches[0]
    return [
        spec.space.candidate(batch, p, False, o)
        for p in spec.space.precisions
        for o in spec.space.optimizers
    ]
