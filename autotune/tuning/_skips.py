"""What the search already knows: configs it need not run, and configs still open.

Pure functions over the study's records, so the rules are tested without probing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

from autotune.core.enums import Outcome
from autotune.core.optimizers import optimizer
from autotune.core.space import SearchSpace
from autotune.core.trial import Candidate, TrialRecord


class Verdictor(Protocol):
    """The memory estimate's verdicts (tuning.memory_verdict.EstimateVerdicts)."""

    def __call__(self, candidate: Candidate) -> str | None:
        """Why the candidate cannot fit (skip it as infeasible), or None."""

    def fits(self, candidate: Candidate) -> bool:
        """Whether the estimate says it fits."""


class NoEstimate:
    """No verdict: nothing is ruled out, everything may fit."""

    def __call__(self, candidate: Candidate) -> str | None:
        return None

    def fits(self, candidate: Candidate) -> bool:
        return True


NO_ESTIMATE = NoEstimate()


@dataclasses.dataclass(frozen=True)
class Skip:
    reason: str
    implies_oom: bool  # True: recorded as an infeasible point; False: a redundant proposal


def skip_reason(
    candidate: Candidate,
    records: Sequence[TrialRecord],
    space: SearchSpace,
    predicted_over: Verdictor = NO_ESTIMATE,
    in_flight: Mapping[Candidate, int] | None = None,
    *,
    first_guess: bool = False,
) -> Skip | None:
    """Why this proposal need not run, or None when it must be probed.

    `in_flight` maps configs other workers are probing now to their trial numbers.
    `first_guess`: queued before any probe (the recipe, the usual fast settings); once
    the estimate, fitted to the probes since, says it will not fit, it waits (left open,
    not ruled out) for the proposals to reach it, instead of spending a launch on an
    out-of-memory the estimate expects (the recipe's OOM bounds the activations).
    """
    for record in records:
        if record.candidate == candidate:
            return Skip(f"duplicate of trial {record.number}", implies_oom=False)
    if candidate.levers.clash:
        return Skip(f"not a run: {candidate.levers.clash}", implies_oom=False)
    if candidate.levers.redundant:
        return Skip(f"redundant: {candidate.levers.redundant}", implies_oom=False)
    if in_flight and candidate in in_flight:
        return Skip(f"trial {in_flight[candidate]} is probing it", implies_oom=False)
    implying = [
        r
        for r in records
        if r.result.outcome == Outcome.OOM and oom_implies(r.candidate, candidate)
    ]
    oom = min(implying, key=lambda r: r.candidate.per_device_train_batch_size, default=None)
    if oom is not None:
        found = oom.candidate
        batch = found.per_device_train_batch_size
        lighter = f" with {found.optim}" if found.optim != candidate.optim else ""
        if found.activation_checkpointing != candidate.activation_checkpointing:
            lighter += f" {found.activation_checkpointing.label}"
        return Skip(f"skipped: batch {batch}{lighter} OOM in trial {oom.number}", implies_oom=True)
    failing = failing_precision(candidate.precision, records)
    if failing:
        return Skip(f"skipped: {failing}", implies_oom=False)
    over = predicted_over(candidate)
    if over is not None:
        return Skip(f"skipped: {over}", implies_oom=True)
    if first_guess and not predicted_over.fits(candidate):
        return Skip("first guess deferred: the estimate says it will not fit", implies_oom=False)
    if not fallback_open(candidate, records, space, predicted_over):
        smallest = space.micro_batches[0]
        return Skip(
            f"batch {candidate.per_device_train_batch_size} is a fallback, tried only once "
            f"batch {smallest} runs out of memory or is estimated not to fit",
            implies_oom=False,
        )
    return None


def failing_precision(precision: str, records: Sequence[TrialRecord]) -> str:
    """Why a precision need not be probed again: it failed with the same error in two
    probes that differ in other settings, and no probe of it ran ("" otherwise). A job
    that cannot train in it at all (fp16 on adapters held in bf16, a kernel without it)
    would fail every other config of it alike."""
    ran = [r for r in records if r.candidate.precision == precision]
    if any(r.result.outcome != Outcome.ERROR for r in ran):
        return ""
    reasons: dict[str, list[int]] = {}
    for r in ran:
        reasons.setdefault(r.result.reason, []).append(r.number)
    alike = next(((r, n) for r, n in reasons.items() if len(n) >= 2), None)
    if alike is None:
        return ""
    reason, numbers = alike
    said = reason.splitlines()[0][:80] if reason else "an error"
    return f"{precision} failed alike in trials {numbers[0]} and {numbers[1]} ({said})"


def oom_implies(oom: Candidate, candidate: Candidate) -> bool:
    """Whether `oom` running out of memory says `candidate` does too: a larger batch of
    its family, or the same batch or larger with an optimizer that holds more (its
    declaration's `lighter`, core/optimizers.py)
    or less activation checkpointing."""
    batch, at = oom.per_device_train_batch_size, candidate.per_device_train_batch_size
    if oom.family == candidate.family:
        return batch < at
    return _lighter_twin(oom, candidate) and batch <= at


def smallest_oom(candidate: Candidate, records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The smallest batch measured out of memory of the candidate's family, or of a twin
    that holds no more memory (a lighter optimizer, more checkpointing)."""
    ooms = [
        r
        for r in records
        if r.result.outcome == Outcome.OOM
        and (r.candidate.family == candidate.family or _lighter_twin(r.candidate, candidate))
    ]
    return min(ooms, key=lambda r: r.candidate.per_device_train_batch_size, default=None)


def _lighter_twin(oom: Candidate, candidate: Candidate) -> bool:
    """`oom`'s family is the candidate's but for an optimizer that holds less (`lighter`),
    or a level of checkpointing that frees more (core/checkpointing.py: memory is
    monotone along the levels), or both (any batch)."""
    if oom.family == candidate.family:
        return False
    lighter = oom.optim == candidate.optim or oom.optim in optimizer(candidate.optim).lighter
    level, at = oom.activation_checkpointing, candidate.activation_checkpointing
    twin = dataclasses.replace(oom, optim=candidate.optim, activation_checkpointing=at)
    return lighter and level.rank >= at.rank and twin.family == candidate.family


def fallback_open(
    candidate: Candidate,
    records: Sequence[TrialRecord],
    space: SearchSpace,
    estimate: Verdictor = NO_ESTIMATE,
) -> bool:
    """A regular batch is always open; a fallback (1, 2, 4) once its family's batch 8 ran
    out of memory, or, 8 not yet measured, once the estimate (fitted to the study's
    peaks) says 8 will not fit and the fallback will: waiting for each family's own OOM
    at 8 spent a probe per family where memory binds, and left the fallbacks of most
    families unexplored."""
    batch = candidate.per_device_train_batch_size
    if batch in space.micro_batches:
        return True
    smallest = space.micro_batches[0]
    oom = smallest_oom(candidate, records)
    if oom is not None and oom.candidate.per_device_train_batch_size <= smallest:
        return True
    steps = candidate.gradient_accumulation_steps * batch // smallest
    regular = dataclasses.replace(
        candidate, per_device_train_batch_size=smallest, gradient_accumulation_steps=steps
    )
    if any(r.candidate == regular and r.result.outcome == Outcome.OK for r in records):
        return False  # measured: 8 fits, and a measurement outranks the estimate
    return not estimate.fits(regular) and estimate.fits(candidate)


def open_candidates(
    space: SearchSpace,
    records: Sequence[TrialRecord],
    predicted_over: Verdictor = NO_ESTIMATE,
    in_flight: Mapping[Candidate, int] | None = None,
) -> list[Candidate]:
    """Candidates neither measured, ruled out, nor being probed: what is left to search."""
    return [
        c
        for c in space.candidates()
        if skip_reason(c, records, space, predicted_over, in_flight) is None
    ]
