"""What a study means, computed (no drawing, no HTML): the winner, the reference it is
compared with, the configs that tie with it, what changed, and what the search cost.

The report draws and prints these; the tests check them directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autotune.core.enums import Objective, Outcome
from autotune.core.parity import Change, changes
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialRecord
from autotune.tuning.parity import baseline, reference_candidate
from autotune.tuning.selection import fitting, noise_band, ranked_sps, select_for


@dataclasses.dataclass(frozen=True)
class Insight:
    best: TrialRecord | None
    reference: TrialRecord | None  # what the headline compares with, when it was measured
    reference_name: str  # "your recipe" or "the plain default"
    ties: tuple[int, ...]  # trials within the winner's noise band (the winner included)
    band: float  # that band, relative
    changes: tuple[Change, ...]  # against the user's recipe (the parity reference)
    probes: int  # runs launched, confirmations included
    probe_seconds: float  # their wall time, summed
    objective: Objective = Objective.THROUGHPUT  # what `best` was selected by


def pareto_front(records: Sequence[TrialRecord], fit_limit_bytes: int) -> list[TrialRecord]:
    """Fitting trials no other fitting trial beats on both throughput and memory."""
    pool = fitting(records, fit_limit_bytes)

    def beaten(r: TrialRecord) -> bool:
        sps, peak = r.result.samples_per_s or 0, r.result.peak_memory_bytes or 0
        return any(
            (o.result.samples_per_s or 0) >= sps
            and (o.result.peak_memory_bytes or 0) <= peak
            and ((o.result.samples_per_s or 0) > sps or (o.result.peak_memory_bytes or 0) < peak)
            for o in pool
            if o is not r
        )

    return sorted((r for r in pool if not beaten(r)), key=lambda r: r.result.peak_memory_bytes or 0)


def insight(
    records: Sequence[TrialRecord],
    spec: SearchSpec,
    recipe: Candidate | None = None,
    objective: Objective = Objective.THROUGHPUT,
) -> Insight:
    """`recipe`: the reference the study's parity runs used (default: the one they would);
    `objective`: what the best is selected by."""
    best = select_for(spec, records, objective)
    reference, name = baseline(spec, records, None)
    recipe = recipe or reference_candidate(spec, records)
    band = noise_band(best) if best else 0.0

    def score(record: TrialRecord) -> float:  # ranked as selection ranks: the quiet steps
        if objective == Objective.EFFICIENCY:
            return ranked_sps(record) / max(record.result.peak_memory_bytes or 1, 1)
        return ranked_sps(record)

    top = score(best) if best else 0.0
    ties = tuple(
        r.number
        for r in fitting(records, spec.fit_limit_bytes)
        if best is not None and score(r) >= top * (1 - band)
    )
    # what this study ran: reused figures (with their confirmations) cost it nothing
    measured = [
        r for r in records if r.result.outcome != Outcome.SKIPPED and not r.result.reused_from
    ]
    return Insight(
        best=best,
        reference=reference,
        reference_name=name,
        ties=ties,
        band=band,
        changes=tuple(changes(recipe, best.candidate)) if best else (),
        probes=sum(r.runs for r in measured),
        probe_seconds=sum(_seconds(r) * r.runs for r in measured),
        objective=objective,
    )


def _seconds(record: TrialRecord) -> float:
    """A run's wall time (the child's own total where the parent's was not recorded)."""
    phases = record.result.phases_s
    return float(phases.get("wall") or phases.get("total") or 0.0)


def note(record: TrialRecord, found: Insight) -> str:
    """A few words on a fitting trial's standing: selected, a tie, or how much slower."""
    if found.best is None or record.result.outcome != Outcome.OK:
        return ""
    runs = f"; confirmed ({record.runs} runs)" if record.runs > 1 else ""
    if record.number == found.best.number:
        return "selected" + runs
    if record.number in found.ties:
        return f"tie: within ±{100 * found.band:.0f}% noise of the winner" + runs
    slower = 1 - ranked_sps(record) / (ranked_sps(found.best) or 1.0)
    return f"{100 * slower:.0f}% slower" + runs
