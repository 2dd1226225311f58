"""When exploring stops: one rule over what was measured, the time left and the parity
state (`stop_reason`), and the figures it rests on (what a probe and a confirmation run
take). No store and no clock: the search loop reads both and passes their values.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from autotune.core.enums import Outcome
from autotune.core.parity import Arithmetic
from autotune.core.parity_state import ParityState
from autotune.core.spec import SearchSpec
from autotune.core.stats import ROUNDS_TO_DECIDE
from autotune.core.trial import Candidate, TrialRecord
from autotune.core.units import format_duration
from autotune.tuning._skips import Verdictor, open_candidates
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.tuning.parity import parity_stop, run_s
from autotune.tuning.rehearsal import reserved_s
from autotune.tuning.selection import decided, duel_pair, exportable, fitting


@dataclasses.dataclass(frozen=True)
class TimeLeft:
    """Seconds left to explore and of the whole time budget (None: no budget)."""

    explore_s: float | None
    end_s: float | None = None

    @classmethod
    def at(cls, explore: Deadline, end: Deadline | None = None) -> TimeLeft:
        """What the two deadlines leave now."""
        return cls(explore.left(), None if end is None else end.left())

    @property
    def explore_spent(self) -> bool:
        return self.explore_s is not None and self.explore_s <= 0.0


def stop_reason(
    spec: SearchSpec,
    limits: SearchLimits,
    records: Sequence[TrialRecord],
    busy: Mapping[Candidate, int],
    over: Verdictor,
    left: TimeLeft,
    parity: ParityState | None,
    *,
    rehearses: bool,
) -> str:
    """Why no new probe should start ('' to go on). Probes running elsewhere (`busy`)
    count. Only the clock lets the first probe through: without one measurement there is
    no answer (a study that took measurements over from another has them), but a space
    with nothing left to probe stops it all the same. `rehearses`: the rehearsal before
    the export is left its time."""
    if sum(is_probe(r) for r in records) + len(busy) >= limits.max_trials:
        return f"reached --max-trials {limits.max_trials}"
    first = not busy and all(r.result.outcome == Outcome.SKIPPED for r in records)
    if not first and (why := _out_of_time(spec, limits, records, left, rehearses=rehearses)):
        return why
    if limits.parity_steps and not limits.parity_auto:
        top = limits.confirm_top if limits.parity_top is None else limits.parity_top
        steps, objective = limits.parity_steps, limits.objective
        if why := parity_stop(spec, records, parity, steps, top, objective, left.explore_s):
            return why
    if not busy and not open_candidates(spec.space, records, over):
        return "every config in the space is measured or ruled out"
    return ""


def last_probe(
    spec: SearchSpec,
    limits: SearchLimits,
    records: Sequence[TrialRecord],
    busy: Mapping[Candidate, int],
    left: TimeLeft,
    *,
    rehearses: bool,
) -> bool:
    """Whether the limits allow no probe after the next: --max-trials counts it, or, its
    expected wall spent, the time budget stops the one after (`_out_of_time`)."""
    if sum(is_probe(r) for r in records) + len(busy) + 1 >= limits.max_trials:
        return True
    wall = probe_wall_s(records)
    if not wall:
        return False
    after = TimeLeft(
        None if left.explore_s is None else left.explore_s - wall,
        None if left.end_s is None else left.end_s - wall,
    )
    return bool(_out_of_time(spec, limits, records, after, rehearses=rehearses))


def _out_of_time(
    spec: SearchSpec,
    limits: SearchLimits,
    records: Sequence[TrialRecord],
    left: TimeLeft,
    *,
    rehearses: bool,
) -> str:
    """The time budget's reasons: the explore share spent (unless the time kept from it
    would buy nothing), or a probe that would end past the whole budget with the checks
    the export needs kept (the rehearsal, the paired rounds of a change of arithmetic)."""
    if left.explore_spent and not reserve_idle(spec, limits, records, left.end_s):
        return "time budget spent" + (
            " (the rest is for confirmation)" if limits.confirm_top else ""
        )
    if left.end_s is None:
        return ""
    expected = probe_wall_s(records)
    rehearsal = reserved_s(records, spec, expected) if rehearses else 0.0
    rounds = kept_for_rounds(spec, limits, records, left.end_s)
    if expected + rehearsal + rounds <= left.end_s:
        return ""
    named = (("the rehearsal", rehearsal), ("the paired rounds", rounds))
    kept = [name for name, seconds in named if seconds]
    what = ", ".join(["a probe", *kept[:-1]]) + (f" and {kept[-1]} take" if kept else " takes")
    return (
        f"time budget spent: {what} about {format_duration(expected + rehearsal + rounds)} "
        f"and {format_duration(left.end_s)} is left"
    )


def probe_cutoff_s(
    spec: SearchSpec,
    limits: SearchLimits,
    records: Sequence[TrialRecord],
    end_s: float | None,
    *,
    rehearses: bool,
) -> float | None:
    """How long a probe starting now may run before the time budget stops it: what is
    left of the whole budget (`end_s`) less the checks kept from it, as `_out_of_time`
    keeps them (the rehearsal, the paired rounds). A probe starts only where it is
    expected to end within that, but the next config may be slower than any before it
    (a one-minute NeoX search's last probe, checkpointed with eager attention, took 25 s
    where its probes had taken 13-16, and the search ended at 64 s). None without a
    budget, or before a config that fits is measured: the first measurement runs
    however late, as without it there is nothing to export."""
    if end_s is None or not fitting(records, spec.fit_limit_bytes):
        return None
    expected = probe_wall_s(records)
    rehearsal = reserved_s(records, spec, expected) if rehearses else 0.0
    return max(0.0, end_s - rehearsal - kept_for_rounds(spec, limits, records, end_s))


def kept_for_rounds(
    spec: SearchSpec, limits: SearchLimits, records: Sequence[TrialRecord], left_s: float | None
) -> float:
    """The time kept for the paired rounds (`rounds_s`) with `left_s` left: none where
    they cannot run in it. The change is then not exported, so exploring and the plain
    confirmations may use the time to find and confirm a better config that keeps it."""
    rounds = rounds_s(spec, limits, records)
    return 0.0 if left_s is not None and rounds > left_s else rounds


def fewest_rounds(limits: SearchLimits) -> int:
    """The fewest paired rounds that can decide a change of the recipe's arithmetic
    (core/stats.ROUNDS_TO_DECIDE, or --confirm-rounds where fewer); 0 where the user
    turned the rounds off (--confirm-rounds under 2, --confirm-top 0)."""
    if not limits.confirm_top or limits.confirm_rounds < 2:
        return 0
    return min(ROUNDS_TO_DECIDE, limits.confirm_rounds)


def rounds_s(spec: SearchSpec, limits: SearchLimits, records: Sequence[TrialRecord]) -> float:
    """What the paired rounds that would confirm a change of the recipe's arithmetic are
    expected to take (DESIGN invariant 14: a check, kept from exploring like the
    rehearsal): where the leader changes it unverified, the rounds of it and the best
    config that keeps it that the fewest can decide (core/stats.ROUNDS_TO_DECIDE, or
    --confirm-rounds where fewer), less those they ran together; 0 where no such
    change leads, it is decided, or rounds are off."""
    fewest = fewest_rounds(limits)
    if not fewest:
        return 0.0
    pool = [r for r in fitting(records, spec.fit_limit_bytes) if exportable(r)]
    pair = duel_pair(spec, pool, limits.objective)
    if pair is None:
        return 0.0
    a, b = pair
    same = Arithmetic.of(a.candidate) == Arithmetic.of(b.candidate)
    if same or decided(a, b, spec, limits.objective):
        return 0.0
    together = len(dict(a.rounds).keys() & dict(b.rounds).keys())
    return max(0, fewest - together) * (confirm_s(spec, limits, a) + confirm_s(spec, limits, b))


def change_unconfirmable(
    spec: SearchSpec, limits: SearchLimits, records: Sequence[TrialRecord], left_s: float | None
) -> str:
    """Why no change of the recipe's precision or optimizer could be exported any more
    ('' where one could), the clock's reason: no parity runs that verify are planned, and
    the paired rounds such a change needs (the fewest that decide, of it and of a config
    that keeps the arithmetic, each run at least the quickest confirmation of a config
    measured so far) take longer than `left_s`, what is left of the whole budget (time runs down; a
    quicker config measured later may shorten them). Exploring then probes only configs
    that keep the arithmetic, the ones the export may pick (a one-minute NeoX search
    spent two of its five probes on bf16 configs it could never confirm, and exported
    the recipe's config). Where the user turned the rounds off (--confirm-rounds 0, --confirm-top 0)
    the probes still say what a change reads."""
    if left_s is None or limits.parity_auto or limits.parity_steps:
        return ""
    fewest = fewest_rounds(limits)
    measured = fitting(records, spec.fit_limit_bytes)
    if not fewest or not measured:
        return ""
    rounds = 2 * fewest * min(confirm_s(spec, limits, r) for r in measured)
    if rounds <= left_s:
        return ""
    return (
        f"the paired rounds that would confirm a change of your precision or optimizer "
        f"take about {format_duration(rounds)} and {format_duration(max(0.0, left_s))} is left"
    )


def reserve_idle(
    spec: SearchSpec, limits: SearchLimits, records: Sequence[TrialRecord], end_s: float | None
) -> bool:
    """Whether the time kept from exploring would buy nothing: no parity runs are
    planned and no finalist's confirmation fits in what is left of the whole budget
    (`end_s`). Exploring then goes on while a probe fits (a one-minute search here
    stopped at 50 s for a confirmation of 18 s that could never start, and sat idle)."""
    if end_s is None or not limits.confirm_top or limits.parity_steps or limits.parity_auto:
        return False
    pool = [r for r in fitting(records, spec.fit_limit_bytes) if exportable(r)]
    return bool(pool) and all(confirm_s(spec, limits, r) > end_s for r in pool)


def confirm_s(spec: SearchSpec, limits: SearchLimits, record: TrialRecord) -> float:
    """What a confirmation run of `record` is expected to take."""
    return run_s(record.result, spec.warmup_steps + limits.confirm_steps, 1)


def probe_wall_s(records: Sequence[TrialRecord]) -> float:
    """What a new probe is planned to take, start to end: the upper quartile of the wall
    times of this study's probes that ran to their end (one out of memory stops early,
    and the next may fit), of all its probes before any did; before this study probed,
    of the probes it reused from another study of the same job (0 without any). Not the
    median: the configs left to probe are not the median's (a one-minute NeoX search
    started a checkpointed probe with 15 s left on a median of 14.5 s; it took 19 s),
    and one still running where the budget ends is stopped unmeasured
    (`probe_cutoff_s`), its time spent for nothing. Not the slowest: one compiled
    probe's cold compile would stop exploring minutes early."""
    timed = [
        r
        for r in records
        if r.result.outcome != Outcome.SKIPPED and r.result.phases_s.get("wall", 0.0) > 0
    ]
    probes = [r for r in timed if is_probe(r)] or timed
    ended = [r for r in probes if r.result.outcome == Outcome.OK] or probes
    walls = [r.result.phases_s["wall"] for r in ended]
    if len(walls) < 2:
        return walls[0] if walls else 0.0
    return statistics.quantiles(walls, n=4, method="inclusive")[2]


def is_probe(record: TrialRecord) -> bool:
    """A trial --max-trials counts: one that ran (not skipped, not reused)."""
    return record.result.outcome != Outcome.SKIPPED and not record.result.reused_from
