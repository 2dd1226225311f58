"""Why a search stops proposing: --max-trials, the time budget, an exhausted space; and
how it confirms its finalists.

The stop rule is a pure function (`tuning.stopping.stop_reason`) of what was measured,
the time left and the parity state; the time budget is checked with a fake clock: no
sleeping."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

import pytest
from helpers import GIB, SPEC, cand, rec

from autotune.core.enums import Objective
from autotune.core.parity import Arithmetic, Curve
from autotune.core.parity_state import ParityState
from autotune.core.parity_verdict import Parity, Status
from autotune.core.trial import Candidate, TrialRecord
from autotune.tuning import exploring
from autotune.tuning._skips import NO_ESTIMATE, Verdictor
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.tuning.parity import reserved_s
from autotune.tuning.run import SearchRun
from autotune.tuning.stopping import TimeLeft, confirm_s, fewest_rounds, rounds_s, stop_reason


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


never_over = NO_ESTIMATE


def stops(
    limits: SearchLimits,
    records: list[TrialRecord],
    busy: dict[Candidate, int],
    explore: Deadline,
    over: Verdictor = never_over,
    *,
    end: Deadline | None = None,
) -> str:
    """The stop rule as the search loop asks it, with no parity state yet."""
    left = TimeLeft.at(explore, end)
    return stop_reason(SPEC, limits, records, busy, over, left, None, rehearses=False)


def faked(store: Any, limits: SearchLimits, observer: Any, launcher: Any) -> SearchRun:
    """A SearchRun over stand-ins for its store, observer and launcher."""
    return SearchRun(
        store=store,
        study_dir=Path("unused"),
        limits=limits,
        observer=observer,
        launcher=launcher,
    )


def test_the_time_budget_stops_new_probes_at_its_search_share() -> None:
    clock = Clock()
    budget = Deadline.after(100.0, clock)
    explore = budget.share(0.8)  # the rest is for confirming the finalists
    limits = SearchLimits(max_trials=50, confirm_top=3)
    recs = [rec(0, cand(8))]
    clock.now += 79
    assert stops(limits, recs, {}, explore, never_over) == ""
    clock.now += 2
    assert stops(limits, recs, {}, explore, never_over).startswith("time budget spent")
    assert not budget.passed() and budget.left() == 19.0  # confirmation still has its time


def test_the_first_probe_runs_however_late_the_survey_left_it() -> None:
    """A 10 s budget spent by the survey of a slow factory (ci, cores shared): with no
    measurement there is nothing to export, so the first probe starts past the budget;
    once it has a result, the budget stops the next."""
    clock = Clock()
    budget = Deadline.after(10.0, clock)
    limits = SearchLimits(max_trials=50, confirm_top=0)
    clock.now += 15
    assert stops(limits, [], {}, budget, never_over, end=budget) == ""
    assert stops(limits, [], {cand(8): 1}, budget, never_over, end=budget) != ""
    why = stops(limits, [rec(0, cand(8))], {}, budget, never_over, end=budget)
    assert why.startswith("time budget spent")


class NoneFits:
    """The estimate's verdict where nothing fits the memory budget."""

    def __call__(self, candidate: Candidate) -> str | None:
        return "the estimate says it will not fit"

    def fits(self, candidate: Candidate) -> bool:
        return False


def test_a_search_with_nothing_left_to_probe_stops_though_it_probed_nothing() -> None:
    """The first-probe rule lets the clock pass, never an exhausted space: a rerun that
    took every config over from an earlier study (CI hung on it for 15 minutes) stops,
    and so does one whose every config the estimate ruled out."""
    clock = Clock()
    budget = Deadline.after(10.0, clock)
    limits = SearchLimits(max_trials=50, confirm_top=0)
    taken = [
        dataclasses.replace(rec(n, c), result=rec(n, c).result.replace(reused_from="tiny"))
        for n, c in enumerate(SPEC.space.candidates())
    ]
    exhausted = "every config in the space is measured or ruled out"
    assert stops(limits, taken, {}, budget, never_over, end=budget) == exhausted
    clock.now += 15
    assert stops(limits, taken, {}, budget, never_over, end=budget).startswith("time budget spent")
    assert stops(limits, [], {}, budget, NoneFits(), end=budget) == exhausted


def test_max_trials_counts_probes_running_elsewhere_but_not_skips() -> None:
    from autotune.core.enums import Outcome

    limits = SearchLimits(max_trials=3)
    recs = [rec(0, cand(8)), rec(1, cand(16), Outcome.SKIPPED)]
    no_deadline = Deadline.after(None)
    assert stops(limits, recs, {cand(32): 5}, no_deadline, never_over) == ""
    busy = {cand(32): 5, cand(64): 6}
    assert stops(limits, recs, busy, no_deadline, never_over) == "reached --max-trials 3"


def test_a_trial_taken_over_between_ask_and_claim_is_dropped_unprobed(tmp_path: Path) -> None:
    """Another worker failed the trial (judging it abandoned) and re-queued its config:
    this worker neither probes it nor stops, and the config stays in the queue."""
    from optuna.trial import TrialState

    from autotune.store.samplers import make_sampler
    from autotune.store.store import StudyStore

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    store = StudyStore.open(url=url, name="lost", spec=SPEC, sampler=make_sampler("tpe", 0))
    store.queue.enqueue(cand(8))
    asked = store.queue.ask()

    def ask_then_lose() -> Any:
        store.study.tell(asked.number, state=TrialState.FAIL)  # as a rival's recovery does
        store.queue.enqueue(cand(8))
        return asked

    store.queue.ask = ask_then_lose  # type: ignore[method-assign]
    launcher: Any = type("NoLaunch", (), {"run": lambda *a, **k: pytest.fail("probed")})()
    search = SearchRun(
        store=store,
        study_dir=tmp_path,
        limits=SearchLimits(),
        observer=None,  # type: ignore[arg-type]
        launcher=launcher,
    )
    exploring.step(search, [], {}, never_over)
    assert search.probes == 0
    waiting = store.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert len(waiting) == 1


def timed(
    number: int, candidate: Candidate, step_s: float, one_time_s: float, start_s: float = 0.0
) -> TrialRecord:
    r = rec(number, candidate, sps=64 / step_s)
    return dataclasses.replace(
        r,
        result=r.result.replace(
            step_time_median_s=step_s,
            step_times_s=(step_s,) * 5,
            one_time_s=one_time_s,
            phases_s={"total": start_s + 10.0, "train": 10.0},
        ),
    )


# The recipe, fp32 AdamW, at 2 s a step at 64x1 and 3 s at 32x2 (its twin); bf16 at 1 s,
# its child 4 s to start; 4 parity steps, 5 held-out evaluations (steps 0 to 4) of 16
# samples in fp32, each a third of the reference's 64-sample step
RECORDS = [
    timed(0, cand(64), 2.0, 3.0),
    timed(1, cand(64, "bf16"), 1.0, 2.0, start_s=4.0),
    timed(2, cand(32), 3.0, 1.0),
]
EVALUATIONS = 5 * (16 / 64) / 3 * 2.0
REFERENCE, TWIN, BF16 = 3.0 + 4 * 2.0, 1.0 + 4 * 3.0, 4.0 + 2.0 + 4 * 1.0
ADAFACTOR = dataclasses.replace(cand(64, "bf16"), optim="adafactor")


def test_the_parity_runs_time_is_predicted_from_the_measured_steps() -> None:
    """The reference trains the recipe's quickest config, the twin the recipe's other
    split, the bf16 finalist its own config; nothing measured: nothing to reserve."""
    expected = REFERENCE + TWIN + BF16 + 3 * EVALUATIONS
    assert reserved_s(SPEC, RECORDS, None, 4, 3, Objective.THROUGHPUT) == pytest.approx(expected)
    assert reserved_s(SPEC, [], None, 4, 3, Objective.THROUGHPUT) == 0.0
    # One process doing two processes' work: each step counts twice.
    two = dataclasses.replace(SPEC, nproc_per_node=2)
    doubled = expected + 4 * (2.0 + 3.0 + 1.0)
    assert reserved_s(two, RECORDS, None, 4, 3, Objective.THROUGHPUT) == pytest.approx(doubled)


def test_runs_already_made_are_not_reserved_again_but_failed_ones_are() -> None:
    """A resumed search: the reference and twin curves are stored, so only the bf16 run
    is left; with its verdict stored too nothing is. A verdict that could not be reached
    (unchecked) and a reference run that failed (and so its twin) are run again, so they
    are reserved."""
    curve = Curve(((0, 5.0), (4, 4.0)), steps=4)
    ran = ParityState(cand(64), 4, 1e-3, 0, curves={"reference": curve, "twin": curve})
    got = reserved_s(SPEC, RECORDS, ran, 4, 3, Objective.THROUGHPUT)
    assert got == pytest.approx(BF16 + EVALUATIONS)
    bf16 = Arithmetic.of(cand(64, "bf16")).key
    judged = dataclasses.replace(ran, verdicts={bf16: Parity(Status.OK)})
    assert reserved_s(SPEC, RECORDS, judged, 4, 3, Objective.THROUGHPUT) == 0.0
    unchecked = dataclasses.replace(ran, verdicts={bf16: Parity(Status.UNCHECKED)})
    got = reserved_s(SPEC, RECORDS, unchecked, 4, 3, Objective.THROUGHPUT)
    assert got == pytest.approx(BF16 + EVALUATIONS)
    lost = {"reference": Curve((), error="oom"), "twin": curve}  # the twin goes with it
    failed = dataclasses.replace(unchecked, curves=lost)
    got = reserved_s(SPEC, RECORDS, failed, 4, 3, Objective.THROUGHPUT)
    assert got == pytest.approx(REFERENCE + TWIN + BF16 + 3 * EVALUATIONS)
    # Finalists that all keep the recipe's arithmetic need no parity run at all.
    fp32 = [r for r in RECORDS if r.candidate.precision == "fp32"]
    assert reserved_s(SPEC, fp32, None, 4, 3, Objective.THROUGHPUT) == 0.0


def test_exploring_stops_early_enough_for_the_parity_runs_within_the_time_budget() -> None:
    """The parity runs happen within --time-budget: no new probe starts once the time
    left to explore is what they are expected to take; with parity off it goes on. A
    worker (which confirms nothing) leaves time for its parent's three finalists, bf16
    Adafactor's run among them, not only for the fastest."""
    records = [*RECORDS, timed(3, ADAFACTOR, 1.2, 2.0)]
    clock = Clock()
    explore = Deadline.after(100.0, clock)
    limits = SearchLimits(max_trials=50, confirm_top=3, parity_steps=4)

    reserve = reserved_s(SPEC, records, None, 4, 3, Objective.THROUGHPUT)
    assert reserve > reserved_s(SPEC, records, None, 4, 1, Objective.THROUGHPUT)
    worker = dataclasses.replace(limits, confirm_top=0, parity_top=3)
    clock.now += 99 - reserve
    for limited in (limits, worker):
        assert stops(limited, records, {}, explore, never_over) == ""
    clock.now += 1.5
    why = stops(limits, records, {}, explore, never_over)
    assert why.startswith(
        f"time budget spent: the rest is for the parity runs (about {reserve:.0f}s"
    )
    assert why.endswith("and confirmation")
    assert stops(worker, records, {}, explore, never_over) == why
    no_parity = dataclasses.replace(limits, parity_steps=0)
    assert stops(no_parity, records, {}, explore, never_over) == ""


def test_a_confirmation_expected_to_end_past_the_time_budget_does_not_start() -> None:
    """The first finalist's confirmation (the fp32 recipe at 64x1, which the export is
    until paired rounds confirm the bf16 gain: 3 s once, warm-up and 4 timed steps of
    2 s) does not start with a second less than that left, and starts with a second
    more: the search ends within --time-budget."""
    from types import SimpleNamespace

    from autotune.core.enums import Outcome
    from autotune.core.trial import TrialResult

    ran: list[Candidate] = []
    store = SimpleNamespace(
        spec=SPEC, records=lambda: RECORDS, add_confirmation=lambda *a: None, next_round=lambda: 0
    )
    launcher = SimpleNamespace(
        run=lambda config, timeout_s: ran.append(config.candidate) or TrialResult(Outcome.OK)
    )
    observer = SimpleNamespace(on_confirm=lambda *a: None)
    limits = SearchLimits(confirm_top=1, confirm_steps=4, confirm_rounds=0)
    search = faked(store, limits, observer, launcher)
    expected = 3.0 + (SPEC.warmup_steps + 4) * 2.0
    clock = Clock()
    assert search.confirm(Deadline(clock.now + expected - 1, clock)) == 0 and not ran
    assert search.confirm(Deadline(clock.now + expected + 1, clock)) >= 1
    assert ran[0] == cand(64)


def test_the_paired_rounds_a_change_of_arithmetic_needs_are_kept_from_the_clock() -> None:
    """bf16 leads the fp32 recipe unverified: the export hinges on paired rounds of the
    two (DESIGN invariant 14). Exploring keeps their time, the three rounds of both that
    decide at the least (core/stats.ROUNDS_TO_DECIDE), as it keeps the rehearsal's, and
    the finalists' plain confirmations leave it to them: the rounds go first. Rounds
    that cannot run in what is left keep nothing (the change is not exported then), nor
    where the leader keeps the recipe's arithmetic."""
    from types import SimpleNamespace

    from autotune.core.enums import Outcome
    from autotune.core.trial import TrialResult

    limits = SearchLimits(max_trials=50, confirm_top=1, confirm_steps=4)
    bf16, recipe = RECORDS[1], RECORDS[0]
    pair = confirm_s(SPEC, limits, bf16) + confirm_s(SPEC, limits, recipe)
    assert rounds_s(SPEC, limits, RECORDS) == pytest.approx(3 * pair)
    keeping = [r for r in RECORDS if r.candidate.precision == "fp32"]
    assert rounds_s(SPEC, limits, keeping) == 0.0
    assert rounds_s(SPEC, dataclasses.replace(limits, confirm_rounds=0), RECORDS) == 0.0
    clock = Clock()
    explore = Deadline.after(1000.0, clock)
    assert stops(limits, RECORDS, {}, explore, end=Deadline.after(3 * pair + 1, clock)) == ""
    probes = [
        dataclasses.replace(r, result=r.result.replace(phases_s={**r.result.phases_s, "wall": 8.0}))
        for r in RECORDS
    ]
    left = 3 * pair + 4  # the rounds fit, but not after another 8 s probe
    why = stops(limits, probes, {}, explore, end=Deadline.after(left, clock))
    assert why.startswith("time budget spent: a probe and the paired rounds take about")
    # rounds that cannot run in what is left keep nothing: the change is not exported,
    # and exploring may still find a better config that keeps the arithmetic
    assert stops(limits, probes, {}, explore, end=Deadline.after(3 * pair - 1, clock)) == ""

    ran: list[Candidate] = []
    store = SimpleNamespace(
        spec=SPEC, records=lambda: RECORDS, add_confirmation=lambda *a: None, next_round=lambda: 0
    )
    launcher = SimpleNamespace(
        run=lambda config, timeout_s: ran.append(config.candidate) or TrialResult(Outcome.OK)
    )
    observer = SimpleNamespace(on_confirm=lambda *a: None, on_plan=lambda *a: None)
    search = faked(store, limits, observer, launcher)
    search.confirm(Deadline(clock.now + 3 * pair + 1, clock))
    assert ran[:2] == [bf16.candidate, recipe.candidate]  # a paired round, not a lone run
    ran.clear()  # with no time for the rounds, the recipe (the export then) is confirmed
    one = confirm_s(SPEC, limits, recipe)
    assert search.confirm(Deadline(clock.now + one + 1, clock)) >= 1
    assert set(ran) == {recipe.candidate}  # (this fake store never counts the run)


def test_the_plain_default_is_confirmed_after_the_finalists() -> None:
    """The headline ratio to the plain default rests on runs measured as the finalists'
    are: after the finalists, the default (fp32 AdamW at batch 8) is measured again too,
    and with --confirm-top 0 nothing is."""
    from types import SimpleNamespace

    from autotune.core.enums import Outcome
    from autotune.core.trial import TrialResult

    records = {r.number: r for r in [*RECORDS, timed(3, cand(8), 4.0, 1.0)]}

    def confirmed(record: TrialRecord, *_: object) -> None:
        records[record.number] = dataclasses.replace(record, runs=record.runs + 1)

    ran: list[Candidate] = []
    store = SimpleNamespace(
        spec=SPEC,
        records=lambda: list(records.values()),
        add_confirmation=confirmed,
        next_round=lambda: 0,
    )
    launcher = SimpleNamespace(
        run=lambda config, timeout_s: ran.append(config.candidate) or TrialResult(Outcome.OK)
    )
    observer = SimpleNamespace(on_confirm=lambda *a: None)

    def search(top: int) -> SearchRun:
        return SearchRun(
            store=store,
            study_dir=Path("unused"),  # type: ignore[arg-type]
            limits=SearchLimits(confirm_top=top, confirm_steps=4, confirm_rounds=0),
            observer=observer,
            launcher=launcher,
        )  # type: ignore[arg-type]

    assert search(0).confirm(Deadline(None)) == 0 and not ran
    assert search(1).confirm(Deadline(None)) == 2
    assert ran == [cand(64), cand(8)]  # the export, until paired rounds confirm bf16's gain


def test_no_probe_starts_that_is_expected_to_end_past_the_whole_time_budget() -> None:
    """Probes of this study took 20, 30 and 40 s: one is planned at their upper quartile,
    35 s (a slower config than the median's may come next, and a probe runs to its
    end). With 34 s of the whole budget left none starts, though the explore share has
    not passed; with 36 s one does."""
    probes = [
        dataclasses.replace(r, result=r.result.replace(phases_s={"wall": wall}))
        for r, wall in ((rec(0, cand(8)), 30.0), (rec(1, cand(16)), 20.0), (rec(2, cand(32)), 40.0))
    ]
    clock = Clock()
    explore = Deadline.after(1000.0, clock)
    limits = SearchLimits(max_trials=50)
    assert stops(limits, probes, {}, explore, never_over, end=Deadline.after(36.0, clock)) == ""
    why = stops(limits, probes, {}, explore, never_over, end=Deadline.after(34.0, clock))
    assert why == "time budget spent: a probe takes about 35s and 34s is left"


def test_the_last_probe_the_limits_allow_is_known_before_it_starts() -> None:
    """The proposal of the last probe is made for it (`_propose`: the greatest expected
    gain, as nothing follows): --max-trials counts it and the probes running elsewhere;
    on the clock, the next is the last where, its expected wall (35 s) spent, the
    budget would stop the one after."""
    from autotune.tuning.stopping import last_probe

    probes = [
        dataclasses.replace(r, result=r.result.replace(phases_s={"wall": wall}))
        for r, wall in ((rec(0, cand(8)), 30.0), (rec(1, cand(16)), 20.0), (rec(2, cand(32)), 40.0))
    ]

    def last(limits: SearchLimits, busy: dict[Candidate, int], left: TimeLeft) -> bool:
        return last_probe(SPEC, limits, probes, busy, left, rehearses=False)

    untimed = TimeLeft(None, None)
    assert last(SearchLimits(max_trials=4), {}, untimed)
    assert not last(SearchLimits(max_trials=5), {}, untimed)
    assert last(SearchLimits(max_trials=5), {cand(64): 3}, untimed)
    many = SearchLimits(max_trials=50)
    assert last(many, {}, TimeLeft(1000.0, 60.0))  # 25 s after it: no room for another
    assert not last(many, {}, TimeLeft(1000.0, 80.0))
    assert last(many, {}, TimeLeft(20.0, 1000.0))  # the explore share spent after it
    assert not last(many, {}, TimeLeft(40.0, 1000.0))


def test_a_rerun_that_reused_every_fitting_config_plans_its_probes_by_their_walls() -> None:
    """A rerun took its measured configs over from an earlier study of the same job: its
    next probe is planned at their walls (about 30 s), not at 0, so none starts with 20 s
    of the whole budget left only to be stopped unmeasured; once it probed on its own,
    its own walls plan the next."""
    reused = [
        dataclasses.replace(
            r, result=r.result.replace(phases_s={"wall": 30.0}, reused_from="study tiny trial 0")
        )
        for r in (rec(0, cand(8)), rec(1, cand(16)))
    ]
    clock = Clock()
    explore = Deadline.after(1000.0, clock)
    limits = SearchLimits(max_trials=50)
    why = stops(limits, reused, {}, explore, never_over, end=Deadline.after(20.0, clock))
    assert why == "time budget spent: a probe takes about 30s and 20s is left"
    own = dataclasses.replace(
        rec(2, cand(32)), result=rec(2, cand(32)).result.replace(phases_s={"wall": 10.0})
    )
    assert (
        stops(limits, [*reused, own], {}, explore, never_over, end=Deadline.after(20.0, clock))
        == ""
    )


def test_a_parity_run_expected_to_end_past_the_time_budget_does_not_start() -> None:
    """The bf16 finalist needs its own run, the reference's and the twin's (the time
    budget's parity runs of `RECORDS`): with a second less than they take left, none
    starts, the arithmetic stays unchecked and the search says so; with a second more,
    they run."""
    from types import SimpleNamespace

    from autotune.core.enums import Outcome
    from autotune.core.trial import TrialResult
    from autotune.tuning.parity import ParityCheck

    ran: list[Candidate] = []
    said: list[str] = []
    curve = ((0, 5.0), (2, 4.0), (4, 3.0))
    store = SimpleNamespace(
        spec=SPEC,
        records=lambda: RECORDS,
        settings=SimpleNamespace(parity=lambda: None, save_parity=lambda s: None),
    )
    launcher = SimpleNamespace(
        run=lambda config, timeout_s: (
            ran.append(config.candidate) or TrialResult(Outcome.OK, curve=curve)
        )
    )
    observer = SimpleNamespace(
        on_plan=said.append, on_parity=lambda *a: None, on_parity_start=lambda *a: None
    )
    limits = SearchLimits(confirm_top=1, parity_check=True, parity_steps=4)
    search = faked(store, limits, observer, launcher)
    need = REFERENCE + TWIN + BF16 + 3 * EVALUATIONS
    clock = Clock()
    state = ParityCheck(search, limits).settle(Deadline(clock.now + need - 1, clock))
    assert not ran and not state.verdicts
    assert said[-1].startswith("parity: no run for bf16 adamw_torch: its runs take about")
    assert said[-1].endswith("left; unchecked")
    ParityCheck(search, limits).settle(Deadline(clock.now + need + 1, clock))
    assert ran


def test_close_finalists_are_timed_in_alternating_paired_rounds_until_they_separate() -> None:
    """fp32 AdamW (the recipe) and bf16 read alike from pooled steps: the host was 30%
    slower in every other round, and bf16's 10% gain hides in that. Timed beside each
    other, the order alternating, each round's pair shows the same gain: two rounds
    that agree exactly settle it (its interval 1.11-1.11x), no more run, and the bf16
    change is exported for a gain that holds."""
    from types import SimpleNamespace

    from autotune.core.enums import Outcome
    from autotune.core.stats import quiet_step_s
    from autotune.core.trial import TrialResult
    from autotune.tuning.selection import select_for

    def result(step_s: float) -> TrialResult:
        return TrialResult(
            Outcome.OK,
            samples_per_s=64 / step_s,
            peak_memory_bytes=GIB,
            step_time_median_s=step_s,
            step_times_s=(step_s,) * 4,
        )

    def probed(number: int, candidate: Candidate, steps: tuple[float, ...]) -> TrialRecord:
        r = rec(number, candidate)
        median = statistics.median(steps)
        return dataclasses.replace(
            r,
            result=r.result.replace(
                samples_per_s=64 / median, step_time_median_s=median, step_times_s=steps
            ),
        )

    records = {
        0: probed(0, cand(8), (1.0, 1.3, 1.0, 1.3, 1.0)),
        1: probed(1, cand(8, "bf16"), (0.9, 1.17, 0.9, 1.17, 0.9)),
    }
    ran: list[tuple[int, str]] = []
    rounds: list[int] = []

    def confirmed(record: TrialRecord, run: TrialResult, _v: Any, _f: str, number: int) -> None:
        ran.append((number, str(record.candidate.precision)))
        rounds.append(number)
        old = records[record.number]
        records[record.number] = dataclasses.replace(
            old, runs=old.runs + 1, rounds=(*old.rounds, (number, quiet_step_s(run) or 0.0))
        )

    def launch(config: Any, timeout_s: float) -> TrialResult:
        host = 1.3 if len(ran) in (1, 2) else 1.0  # round 1 (runs 2 and 3) was slow
        return result((0.9 if config.candidate.precision == "bf16" else 1.0) * host)

    store = SimpleNamespace(
        spec=SPEC,
        records=lambda: list(records.values()),
        add_confirmation=confirmed,
        next_round=lambda: 1 + max(rounds, default=-1),
    )
    said: list[str] = []
    observer = SimpleNamespace(on_confirm=lambda *a: None, on_plan=said.append)
    search = SearchRun(
        store=store,  # type: ignore[arg-type]
        study_dir=Path("unused"),
        limits=SearchLimits(confirm_top=1, confirm_steps=4),
        observer=observer,  # type: ignore[arg-type]
        launcher=SimpleNamespace(run=launch),  # type: ignore[arg-type]
    )
    assert select_for(SPEC, list(records.values())).number == 0  # a tie: the recipe's
    clock = Clock()
    assert search.confirm(Deadline.after(1000.0, clock)) == 5
    # round 0: the finalist (and the default, the same config); then the pair (the bf16
    # change that leads and the recipe), each round in the other order
    assert ran == [(0, "fp32"), (1, "fp32"), (1, "bf16"), (2, "bf16"), (2, "fp32")]
    assert (
        said[-1]
        == "paired rounds: trial 1 against trial 0: 1.11x (1.11-1.11x over 2 paired rounds)"
    )
    assert select_for(SPEC, list(records.values())).number == 1


def test_time_kept_for_a_confirmation_that_cannot_start_goes_to_exploring() -> None:
    """Past the explore share, exploring stops for confirmation only where one can run:
    with 19 s of the budget left, a 12-step confirmation (over 19 s for every finalist)
    could never start, so 8 s probes go on until one would end past the budget; a
    4-step one fits, and exploring stops for it. Planned parity runs keep their time."""
    probes = [
        dataclasses.replace(r, result=r.result.replace(phases_s={**r.result.phases_s, "wall": 8.0}))
        for r in RECORDS
    ]
    clock = Clock()
    budget = Deadline.after(100.0, clock)
    explore = budget.share(0.8)
    clock.now += 81
    long, short = (SearchLimits(max_trials=50, confirm_steps=n) for n in (12, 4))
    assert (
        min(confirm_s(SPEC, long, r) for r in probes)
        > 19
        >= min(confirm_s(SPEC, short, r) for r in probes)
    )
    assert stops(long, probes, {}, explore, never_over, end=budget) == ""
    why = stops(short, probes, {}, explore, never_over, end=budget)
    assert why == "time budget spent (the rest is for confirmation)"
    parity = SearchLimits(max_trials=50, confirm_steps=12, parity_steps=4)
    why = stops(parity, probes, {}, explore, never_over, end=budget)
    assert why == "time budget spent (the rest is for confirmation)"
    clock.now += 12  # 7 s left: no probe fits either
    why = stops(long, probes, {}, explore, never_over, end=budget)
    assert why == "time budget spent: a probe takes about 8s and 7s is left"


def test_where_the_rounds_cannot_fit_a_change_of_arithmetic_is_not_probed(tmp_path: Path) -> None:
    """A one-minute NeoX search: the recipe (fp32 AdamW) probed at 5 s a step, a run
    starting in 1 s. The rounds a bf16 change needs (the three that decide, of it and of
    a config keeping fp32 AdamW, each 3 warm-up and 4 timed steps: 6 x 36 s) cannot end
    in the 40 s left,
    so nothing could export a change: a queued bf16 config is skipped with the reason,
    and a config that keeps the arithmetic is probed. With the time for the rounds, or
    parity runs that verify, or the rounds turned off by the user, nothing is held back."""
    from types import SimpleNamespace

    from autotune.core.enums import Outcome
    from autotune.core.trial import TrialResult
    from autotune.store.samplers import make_sampler
    from autotune.store.store import StudyStore
    from autotune.tuning.stopping import change_unconfirmable

    recipe = timed(0, cand(8), 5.0, 0.0, start_s=1.0)
    limits = SearchLimits(max_trials=20, confirm_top=3, confirm_steps=4)
    run_s = 1.0 + (SPEC.warmup_steps + 4) * 5.0
    keep = change_unconfirmable(SPEC, limits, [recipe], 40.0)
    assert keep == (
        "the paired rounds that would confirm a change of your precision or optimizer "
        "take about 3m36s and 40s is left"
    )
    assert change_unconfirmable(SPEC, limits, [recipe], 6 * run_s) == ""
    assert change_unconfirmable(SPEC, limits, [recipe], None) == ""  # no budget
    assert change_unconfirmable(SPEC, limits, [], 40.0) == ""  # nothing measured yet
    for other in ({"parity_steps": 20}, {"parity_auto": True}, {"confirm_rounds": 0}):
        assert (
            change_unconfirmable(SPEC, dataclasses.replace(limits, **other), [recipe], 40.0) == ""
        )

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    store = StudyStore.open(url=url, name="minute", spec=SPEC, sampler=make_sampler("tpe", 0))
    ran: list[Candidate] = []
    seen: list[tuple[Candidate, TrialResult]] = []
    launcher = SimpleNamespace(
        run=lambda config, timeout_s, **_: ran.append(config.candidate) or TrialResult(Outcome.OOM)
    )
    observer = SimpleNamespace(
        on_trial_start=lambda *a: None,
        on_trial_end=lambda number, candidate, result: seen.append((candidate, result)),
    )
    search = faked(store, limits, observer, launcher)
    store.queue.enqueue(cand(8, "bf16"), first_guess=True)
    store.queue.enqueue(cand(16))
    exploring.step(search, [recipe], {}, never_over, keep)
    exploring.step(search, [recipe], {}, never_over, keep)
    assert ran == [cand(16)]
    skipped, why = seen[0][0], seen[0][1].reason
    assert skipped == cand(8, "bf16") and seen[0][1].outcome == Outcome.SKIPPED
    assert why == f"skipped: it changes your arithmetic, and {keep}"


def test_keeping_the_arithmetic_is_said_once_and_only_where_a_config_keeping_it_fits() -> None:
    """The line says why, once, though its figures run down with the clock. Where no
    config that keeps the recipe's fp32 fits (memory binds), the export is a change
    whatever the rounds say: nothing is held back there."""
    from types import SimpleNamespace

    from autotune.core.enums import Outcome
    from autotune.tuning.stopping import change_unconfirmable

    recipe = timed(0, cand(8), 5.0, 0.0, start_s=1.0)
    lines: list[str] = []
    observer = SimpleNamespace(on_plan=lines.append)
    limits = SearchLimits(max_trials=20, confirm_top=3, confirm_steps=4)
    search = faked(SimpleNamespace(spec=SPEC), limits, observer, None)
    for left in (40.0, 30.0):
        assert exploring._keeping_only(search, [recipe], TimeLeft(left, left))
    assert len(lines) == 1
    assert lines[0].startswith("probing only configs that keep your arithmetic (fp32, adamw")
    assert lines[0].endswith("40s is left; a longer --time-budget can weigh a change")
    # memory binds: the recipe ran out of memory and only bf16 fits, so the export is a
    # change whatever the rounds, and the fastest change is still to find
    oom = dataclasses.replace(recipe, result=recipe.result.replace(outcome=Outcome.OOM))
    bf16 = timed(1, cand(8, "bf16"), 3.0, 0.0, start_s=1.0)
    assert change_unconfirmable(SPEC, limits, [oom, bf16], 40.0)
    assert exploring._keeping_only(search, [oom, bf16], TimeLeft(40.0, 40.0)) == ""


def test_a_probe_still_running_at_the_end_of_the_budget_is_stopped_and_queued_again(
    tmp_path: Path,
) -> None:
    """The last probe of a one-minute search, a slower config than any before it, is
    stopped where the budget ends (less the checks kept from it), failed unmeasured, and
    its config queued again for a rerun; before a config that fits is measured nothing
    is cut (the first measurement runs however late)."""
    from types import SimpleNamespace

    from optuna.trial import TrialState

    from autotune.core.enums import Outcome
    from autotune.core.trial import TrialResult
    from autotune.store.samplers import make_sampler
    from autotune.store.store import StudyStore
    from autotune.tuning.stopping import probe_cutoff_s

    recipe = timed(0, cand(8), 5.0, 0.0, start_s=1.0)
    limits = SearchLimits(max_trials=20, confirm_top=0, trial_timeout_s=600.0)
    assert probe_cutoff_s(SPEC, limits, [recipe], 23.0, rehearses=False) == 23.0
    assert probe_cutoff_s(SPEC, limits, [], 23.0, rehearses=False) is None
    assert probe_cutoff_s(SPEC, limits, [recipe], None, rehearses=False) is None

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    store = StudyStore.open(url=url, name="cut", spec=SPEC, sampler=make_sampler("tpe", 0))
    timeouts: list[float] = []

    def run(config: Any, timeout_s: float, ready_s: float) -> TrialResult:
        assert ready_s == 600.0  # a fork server to start first: not the cut's limit
        timeouts.append(timeout_s)
        return TrialResult(Outcome.TIMEOUT, reason=f"still running after {timeout_s:.0f} s")

    said: list[tuple[int, TrialResult]] = []
    observer = SimpleNamespace(
        on_trial_start=lambda *a: None,
        on_trial_end=lambda number, candidate, result: said.append((number, result)),
    )
    search = faked(store, limits, observer, SimpleNamespace(run=run))
    store.queue.enqueue(cand(16, ckpt=True))
    clock = Clock()
    end = Deadline.after(23.0, clock)
    exploring.step(search, [recipe], {}, never_over, end=end)
    assert timeouts == [23.0]
    assert said[0][1].reason == "stopped at the end of the time budget after 23s; a rerun probes it"
    failed = store.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    assert [t.number for t in failed] == [said[0][0]]
    assert store.records() == []  # nothing measured: a rerun probes it
    waiting = store.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert len(waiting) == 1 and store.queue.ask().candidate == cand(16, ckpt=True)
    store.queue.enqueue(cand(32))
    exploring.step(search, [], {}, never_over, end=end)  # nothing fits yet: the limit's own
    assert timeouts == [23.0, 600.0]


class Plans:
    """An observer that keeps the plan lines the search says, and nothing else."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_plan(self, line: str) -> None:
        self.lines.append(line)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class Timed:
    """A launcher whose probes take the time their config would (fp32 5 s a step, bf16
    3 s, checkpointing 30% more; a warm-up and two timed steps, and 1 s to start) on a
    fake clock, cut at the limit they are given."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.ran: list[Candidate] = []

    def run(self, config: Any, timeout_s: float, **_: object) -> Any:
        from autotune.core.enums import Outcome
        from autotune.core.trial import TrialResult

        candidate = config.candidate
        step = (3.0 if candidate.precision == "bf16" else 5.0) * (
            1.3 if candidate.activation_checkpointing else 1.0
        )
        wall = 1.0 + 3 * step
        self.ran.append(candidate)
        self.clock.now += min(wall, timeout_s)
        if wall > timeout_s:
            return TrialResult(Outcome.TIMEOUT, reason=f"still running after {timeout_s:.0f} s")
        return TrialResult(
            Outcome.OK,
            samples_per_s=64 / step,
            peak_memory_bytes=GIB,
            step_time_median_s=step,
            step_times_s=(step, step),
            phases_s={"wall": wall, "total": wall, "train": wall - 1.0},
        )


def test_a_one_minute_search_probes_what_it_may_export_and_ends_within_its_minute(
    tmp_path: Path,
) -> None:
    """The search loop whole, on a fake clock: once the first config is measured, the
    rounds a bf16 change needs (4 confirmations of over a minute) cannot fit, so every
    later probe keeps fp32 AdamW, the search says why once, and no probe runs past the
    minute: it stops at the budget or is cut there."""
    from autotune.tuning.run import prepare_store

    clock = Clock()
    budget = Deadline.after(60.0, clock)
    store = prepare_store(
        spec=SPEC, study_name="minute", storage=f"sqlite:///{tmp_path / 'a.db'}", sampler="model"
    )
    observer = Plans()
    launcher = Timed(clock)
    limits = SearchLimits(max_trials=20, propose=True, confirm_top=3)
    run = faked(store, limits, observer, launcher)
    why = run.explore(budget.share(1.0), wait_for_others=False, end=budget)
    _, *later = launcher.ran
    recipe = Arithmetic.of(cand(8))
    assert later and all(Arithmetic.of(c) == recipe for c in later), launcher.ran
    said = [line for line in observer.lines if "probing only configs that keep" in line]
    assert len(said) == 1
    assert clock.now - 1000.0 <= 60.0 and why.startswith(("time budget spent", "every config"))


@pytest.mark.parametrize(
    ("confirm_top", "confirm_rounds", "fewest"),
    [(3, 8, 3), (3, 3, 3), (3, 2, 2), (3, 1, 0), (3, 0, 0), (0, 8, 0)],
)
def test_the_fewest_rounds_that_decide_a_change(
    confirm_top: int, confirm_rounds: int, fewest: int
) -> None:
    """Three rounds decide (two: t at one degree of freedom is 74), or the user's
    --confirm-rounds where fewer; none where the user turned the rounds off, so no time
    is kept for them."""
    limits = SearchLimits(confirm_top=confirm_top, confirm_rounds=confirm_rounds)
    assert fewest_rounds(limits) == fewest


def test_a_change_whose_twin_ran_out_of_memory_is_weighed_against_the_twin_made_to_fit() -> None:
    """The proposal after a bf16 leader whose fp32 twin (the plain default) ran out of
    memory: the twin checkpointed or at a smaller split, never another bf16 config; once
    one of those fits, the model of step time proposes freely again."""
    from types import SimpleNamespace

    from autotune.core.enums import Outcome
    from autotune.tuning._skips import open_candidates
    from autotune.tuning.selection import twin_variants

    spec = dataclasses.replace(SPEC, recipe_settings={"per_device_train_batch_size": 8})
    store = SimpleNamespace(spec=spec)
    run = faked(store, SearchLimits(max_trials=50, propose=True), observer=None, launcher=None)
    oom = rec(0, cand(8), Outcome.OOM, peak_gib=9.0)
    bf16 = rec(1, cand(8, "bf16"), sps=30.0, peak_gib=2.0)
    proposal = exploring._proposal(run, [oom, bf16], {}, never_over)
    assert proposal is not None and proposal.candidate is not None
    proposed = proposal.candidate
    assert Arithmetic.of(proposed) == Arithmetic.of(cand(8))  # fp32 AdamW, the recipe's
    assert proposed.activation_checkpointing or proposed.per_device_train_batch_size < 8
    # another worker probing a variant: this one proposes as it would without the twin
    busy = {proposed: 2}
    elsewhere = exploring._proposal(run, [oom, bf16], busy, never_over)
    opened = open_candidates(SPEC.space, [oom, bf16], never_over, busy)
    assert elsewhere == exploring._next(run, [oom, bf16], opened, never_over, False)
    fits = rec(2, proposed, sps=10.0, peak_gib=3.0)
    assert twin_variants(spec, [oom, bf16, fits], cand(8), SPEC.space.candidates()) == []
    after = exploring._proposal(run, [oom, bf16, fits], {}, never_over)
    assert after is not None and after.candidate is not None
