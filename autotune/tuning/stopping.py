"""When exploring stops: one rule over what was measured, the time left and the parity
state (`stop_reason`), and the figures it rests on (what a probe and a confirmation run
take). No store and no clock: the search loop reads both and passes their values.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from autotune.core.enums import Outcome
from autotune.core.parity_state import ParityState
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialRecord
from autotune.core.units import format_duration
from autotune.tuning._skips import Verdictor, open_candidates
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.tuning.parity import parity_stop, run_s
from autotune.tuning.rehearsal import reserved_s
from autotune.tuning.selection import exportable, fitting


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


def _out_of_time(
    spec: SearchSpec,
    limits: SearchLimits,
    records: Sequence[TrialRecord],
    left: TimeLeft,
    *,
    rehearses: bool,
) -> str:
    """The time budget's reasons: the explore share spent (unless the time kept from it
    would buy nothing), or a probe (and the rehearsal) that would end past the whole
    budget."""
    if left.explore_spent and not reserve_idle(spec, limits, records, left.end_s):
        return "time budget spent" + (
            " (the rest is for confirmation)" if limits.confirm_top else ""
        )
    if left.end_s is None:
        return ""
    expected = probe_wall_s(records)
    rehearsal = reserved_s(records, spec, expected) if rehearses else 0.0
    if expected + rehearsal <= left.end_s:
        return ""
    also = " and the rehearsal" if rehearsal else ""
    return (
        f"time budget spent: a probe{also} takes about "
        f"{format_duration(expected + rehearsal)} and {format_duration(left.end_s)} is left"
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
    """What a new probe is expected to take, start to end: the median wall time of this
    study's probes that ran to their end (one out of memory stops early, and the next
    may fit), of all its probes before any did (0 before any)."""
    probes = [r for r in records if is_probe(r) and r.result.phases_s.get("wall", 0.0) > 0]
    ended = [r for r in probes if r.result.outcome == Outcome.OK] or probes
    return statistics.median(r.result.phases_s["wall"] for r in ended) if ended else 0.0


def is_probe(record: TrialRecord) -> bool:
    """A trial --max-trials counts: one that ran (not skipped, not reused)."""
    return record.result.outcome != Outcome.SKIPPED and not record.result.reused_from
