"""Training parity: does a faster config still learn like the user's recipe?

The search keeps the global batch, but two of the things it varies change the training
itself: precision and optimizer. A parity run trains K optimizer steps from the same
initial weights on the same batches and records the loss on fixed held-out batches
(the same samples, forward in fp32, whatever the batch split: a figure that does not
scale with accumulation). A finalist's curve is compared with the reference's (the
user's recipe) over the last part of the run, against a tolerance calibrated from what
rounding alone does: the reference run again with another batch split.

Pure: no torch, no transformers; the child records curves, this module judges them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from autotune.core.enums import Precision
from autotune.core.levers import DECLARED
from autotune.core.optimizers import optimizer
from autotune.core.parity_verdict import Parity, Status
from autotune.core.precisions import precision_spec
from autotune.core.trial import Candidate, TrialResult

# A parity run's held-out loss (probe/_parity.py; tuning/parity.py times it)
# Without a learning_rate of the user's, probes and parity runs train at this one, held
# constant (a warm-up or schedule meant for thousands of steps would stall a run of
# twenty): the loss falls within K steps
PARITY_LR = 1e-3
EVAL_SAMPLES = 16  # held out; evaluated in micro-batches no larger than the run's own
POINTS = 8  # held-out evaluations along a run (plus step 0)
FLOOR = 0.05  # never tighter than 5% of the reference's progress (see benchmarks/RESULTS.md)
ROUNDING_FACTOR = 4.0  # a change may move the loss 4x what a split change does
MIN_PROGRESS = 0.05  # the reference must lower its loss by 5% for a verdict
TAIL = 0.25  # the last quarter of the curve is compared
MAX_TOLERANCE = 0.25  # a noisy twin never widens it past a quarter of the progress
# The shortest run the floor was calibrated for (benchmarks/RESULTS.md: tiny T5's split
# twin differs by 2.5-5.1% of the progress at 12 steps, within the floor at 20-30; mt5-small's
# Adafactor against AdamW sits +1.1% from it at 4 steps and +15.0% at 20). A shorter run
# within the tolerance is unverified: it rules out a NaN, a collapsing loss scale and a
# gross divergence, not a drift that grows with the steps.
CALIBRATED_STEPS = 20
# fp16 steps skipped by the loss scaler (its initial calibration included) beyond this
# share of the run: a collapsing scale
MAX_SKIPPED = 0.25


@dataclasses.dataclass(frozen=True)
class Arithmetic:
    """What decides a config's training arithmetic: its precision and optimizer update,
    and who does the mixed precision (DeepSpeed keeps 16-bit weights with fp32 master
    copies in its optimizer, where the Trainer's autocast keeps fp32 weights)."""

    precision: Precision
    optimizer: str
    engine: str = ""  # "deepspeed": 16-bit precision under ZeRO
    packed: bool = False  # a step trains several samples a row (core/levers.PACKING)

    @classmethod
    def of(cls, candidate: Candidate) -> Arithmetic:
        sixteen = precision_spec(candidate.precision).mixed
        return cls(
            candidate.precision,
            optimizer(candidate.optim).same_update_as or candidate.optim,
            candidate.levers.engine if sixteen else "",
            candidate.levers.changes_samples,
        )

    @property
    def key(self) -> str:
        return (
            f"{self.precision}|{self.optimizer}"
            + (f"|{self.engine}" if self.engine else "")
            + ("|packed" if self.packed else "")
        )


@dataclasses.dataclass(frozen=True)
class Change:
    """One setting that differs from the reference."""

    field: str
    reference: str
    config: str
    keeps_arithmetic: bool

    def describe(self) -> str:
        return f"{self.field} {self.reference} -> {self.config}"


def changes(reference: Candidate, candidate: Candidate) -> list[Change]:
    """What differs from the reference, each marked as keeping or altering the arithmetic.

    The batch split, checkpointing, the sampling order and a fused kernel change how the
    same sums are computed; precision and the optimizer's update change the sums."""
    found = []
    split = f"{candidate.per_device_train_batch_size}x{candidate.gradient_accumulation_steps}"
    ref_split = f"{reference.per_device_train_batch_size}x{reference.gradient_accumulation_steps}"
    if split != ref_split:
        found.append(Change("batch split", ref_split, split, True))
    if candidate.activation_checkpointing != reference.activation_checkpointing:
        was, now = reference.activation_checkpointing, candidate.activation_checkpointing
        found.append(Change("checkpointing", str(was), str(now), True))
    if candidate.train_sampling_strategy != reference.train_sampling_strategy:
        found.append(
            Change(
                "sampling",
                reference.train_sampling_strategy,
                candidate.train_sampling_strategy,
                True,
            )
        )
    # compiled, attention kernels, packed rows: the same sums; a lever that may change
    # them (core/levers.py) keeps them where the same engine runs both
    engines = Arithmetic.of(candidate).engine == Arithmetic.of(reference).engine
    theirs = reference.lever_values()
    for lever, after in zip(DECLARED, candidate.lever_values().values(), strict=True):
        before = theirs[lever.name]
        if before != after:
            keeps = (not lever.engine or engines) and not lever.changes_samples
            found.append(
                Change(lever.name, str(before or "default"), str(after or "default"), keeps)
            )
    if candidate.precision != reference.precision:
        found.append(Change("precision", reference.precision, candidate.precision, False))
    if candidate.optim != reference.optim:
        same = Arithmetic.of(candidate).optimizer == Arithmetic.of(reference).optimizer
        found.append(Change("optimizer", reference.optim, candidate.optim, same))
    return found


@dataclasses.dataclass(frozen=True)
class Curve:
    """The held-out loss at steps 0..K of one parity run, and how the run ended."""

    points: tuple[tuple[int, float], ...]
    skipped_steps: int = 0
    steps: int = 0  # optimizer steps asked for
    error: str = ""  # the run did not finish (an OOM, a crash): no curve to judge

    @classmethod
    def of(cls, result: TrialResult, steps: int) -> Curve:
        error = "" if result.curve else (result.reason or str(result.outcome))
        return cls(tuple(result.curve), result.skipped_steps, steps, error)

    @property
    def start(self) -> float:
        return self.points[0][1]

    @property
    def finite(self) -> bool:
        return all(math.isfinite(loss) for _, loss in self.points)

    @property
    def end(self) -> float:
        """The mean loss over the last quarter of the run (at least two points)."""
        tail = max(2, math.ceil(len(self.points) * TAIL))
        losses = [loss for _, loss in self.points[-tail:]]
        return sum(losses) / len(losses)

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": [list(p) for p in self.points],
            "skipped_steps": self.skipped_steps,
            "steps": self.steps,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Curve:
        points = tuple((int(s), float(v)) for s, v in raw["points"])
        return cls(points, int(raw["skipped_steps"]), int(raw["steps"]), str(raw["error"]))


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How far a finalist's end loss may sit from the reference's, as a fraction of the
    reference's progress (start - end), and what it rests on."""

    fraction: float
    rounding_gap: float | None  # the reference against itself under another batch split

    def describe(self) -> str:
        if self.rounding_gap is None:
            return (
                f"{self.fraction:.1%} of the reference's progress (the floor: no verdict "
                "so far needed the split twin's calibration)"
            )
        return (
            f"{self.fraction:.1%} of the reference's progress (max of the {FLOOR:.0%} floor "
            f"and {ROUNDING_FACTOR:g}x the split twin's {self.rounding_gap:.2%}, at most "
            f"{MAX_TOLERANCE:.0%})"
        )


def tolerance(reference: Curve, twin: Curve | None) -> Tolerance:
    if twin is None or twin.error or not twin.finite or not reference.points:
        return Tolerance(FLOOR, None)
    gap = abs(_gap(reference, twin))
    return Tolerance(min(MAX_TOLERANCE, max(FLOOR, ROUNDING_FACTOR * gap)), gap)


def judge(reference: Curve, run: Curve, tol: Tolerance) -> Parity:
    """The verdict on one finalist's run against the reference's.

    A NaN/inf loss or a collapsing loss scale is diverged whatever the reference did; a
    run that did not finish (an OOM, a crash, a timeout) or a reference that cannot
    serve gives no verdict (unchecked: retried when the search is rerun)."""
    steps = run.steps
    ref_end = reference.end if reference.points and reference.finite else None
    start = reference.start if reference.points else None

    def verdict(status: Status, reason: str, gap: float | None = None) -> Parity:
        end = run.end if run.points else None
        return Parity(
            status,
            reason,
            final_loss=end,
            reference_final_loss=ref_end,
            start_loss=start,
            gap=gap,
            tolerance=tol.fraction,
            steps=steps,
        )

    if run.error or not run.points:
        return Parity(Status.UNCHECKED, f"its parity run did not finish ({run.error})", steps=steps)
    if not run.finite:
        at = next(s for s, loss in run.points if not math.isfinite(loss))
        return verdict(Status.DIVERGED, f"the loss became NaN/inf by step {at}")
    if run.skipped_steps > MAX_SKIPPED * max(1, steps):
        return verdict(
            Status.DIVERGED,
            f"the fp16 loss scale collapsed ({run.skipped_steps} of {steps} steps skipped)",
        )
    if reference.error or not reference.points:
        return verdict(Status.UNCHECKED, f"the reference run did not finish ({reference.error})")
    if not reference.finite:
        return verdict(Status.UNCHECKED, "the reference's own loss is not finite")
    progress = reference.start - reference.end
    if progress < MIN_PROGRESS * abs(reference.start):
        return verdict(
            Status.UNCHECKED,
            f"the reference's loss fell only {progress:.3g} from {reference.start:.4g} in "
            f"{reference.steps} steps; raise --parity-steps",
        )
    gap = _gap(reference, run)
    if abs(gap) <= tol.fraction:
        if unresolved := _unresolved(tol, steps):
            return verdict(Status.UNVERIFIED, unresolved, gap)
        return verdict(Status.OK, "", gap)
    if gap > 0:
        return verdict(Status.DIVERGED, "learns slower than the reference", gap)
    return verdict(
        Status.DIVERGED,
        "learns faster than the reference: a different training, not the same one faster",
        gap,
    )


MIN_PROBE_STEPS = 3  # a start and a tail of two: the fewest losses a probe verdict reads

# A config whose steps train other samples than the recipe's (packed rows) has no verdict:
# its probes train other batches, so their losses pair with none of the recipe's, and a
# parity run of as many steps trains it on more samples than the reference
UNPAIRED = Parity(
    Status.UNCHECKED,
    "its steps train other samples than your recipe's (packed rows hold several): no run "
    "of as many steps pairs with the recipe's",
)


def probe_curve(losses: tuple[float, ...], steps: int) -> Curve:
    """A probe's first `steps` training losses as a curve: (step, the loss its forward
    pass read before that step's update)."""
    return Curve(tuple(enumerate(losses[:steps], start=1)), steps=steps)


def on_scale_of(reference: tuple[float, ...], losses: tuple[float, ...]) -> tuple[float, ...]:
    """`losses` rescaled to the reference's first loss. Every probe's first loss is read
    before any update, from the same weights on the same batch, so the two differ by
    rounding alone, or by a constant factor where the Trainer scales the loss of an
    accumulated step as the model does not (mT5 takes the Trainer's item count and
    ignores it: at 8x2 every step's loss reads twice the 16x1's). The rescaled curve
    keeps what parity judges, how the loss falls from there."""
    if not (reference and losses) or not all(math.isfinite(x) for x in (reference[0], losses[0])):
        return losses
    if reference[0] <= 0 or losses[0] <= 0:
        return losses
    scale = reference[0] / losses[0]
    return tuple(x * scale for x in losses)


def judge_probes(
    reference: tuple[float, ...], run: tuple[float, ...], twin: tuple[float, ...] = ()
) -> tuple[Parity, Tolerance | None]:
    """The verdict from two probes' own training losses (the reference's arithmetic and
    a finalist's; `twin`: the reference's arithmetic under another batch split, which
    calibrates the tolerance), over the steps all of them trained: the same batches
    from the same weights, so the losses pair step by step.

    A probe is too short to verify a change (and its losses are on the batches it
    trains on, not held out): within the tolerance it is `unverified`, never `ok`; off
    it, or NaN, it is `diverged`; too few steps, `unchecked`. Each curve is read on the
    reference's scale (`on_scale_of`): how its loss falls, not the factor a split's
    accumulation puts on it."""
    lengths = [len(reference), len(run), *([len(twin)] if len(twin) >= MIN_PROBE_STEPS else [])]
    steps = min(lengths)
    if steps < MIN_PROBE_STEPS:
        short = Parity(
            Status.UNCHECKED,
            f"its probes trained {steps} steps; a verdict reads at least {MIN_PROBE_STEPS}",
            steps=steps,
            evidence="probes",
        )
        return short, None
    ref = probe_curve(reference, steps)
    twin_curve = probe_curve(on_scale_of(reference, twin), steps) if len(twin) >= steps else None
    tol = tolerance(ref, twin_curve)
    verdict = judge(ref, probe_curve(on_scale_of(reference, run), steps), tol)
    if verdict.status in (Status.OK, Status.UNVERIFIED):
        verdict = dataclasses.replace(
            verdict,
            status=Status.UNVERIFIED,
            reason=f"a probe's {steps} training steps cannot verify a change; "
            f"{CALIBRATED_STEPS}-step parity runs can (--parity on)",
        )
    elif verdict.status == Status.UNCHECKED:  # the reference barely moved: runs may tell
        longer = f"{CALIBRATED_STEPS}-step parity runs may tell (--parity on)"
        verdict = dataclasses.replace(
            verdict, reason=verdict.reason.replace("raise --parity-steps", longer)
        )
    return dataclasses.replace(verdict, evidence="probes"), tol


def _unresolved(tol: Tolerance, steps: int) -> str:
    """Why a run within the tolerance cannot be called the same training ('' when it can):
    too few steps for the tolerance's calibration, or a rounding noise (the split twin's
    gap) that no tolerance up to the cap separates from a real change."""
    if tol.rounding_gap is not None and ROUNDING_FACTOR * tol.rounding_gap > MAX_TOLERANCE:
        return (
            f"rounding alone (the recipe under another batch split) moved the loss by "
            f"{tol.rounding_gap:.1%} of its progress in {steps} steps, too much to tell a "
            "real change from; raise --parity-steps"
        )
    if steps < CALIBRATED_STEPS:
        return (
            f"{steps} steps cannot separate a {tol.fraction:.0%} gap from rounding noise; "
            f"{CALIBRATED_STEPS} can (--parity-steps {CALIBRATED_STEPS})"
        )
    return ""


def needs_twin(verdict: Parity) -> bool:
    """Whether the split twin's calibration could change this verdict (judged against the
    floor alone): only a gap between the floor and the cap can go either way."""
    if verdict.gap is None or verdict.status == Status.UNCHECKED:
        return False
    return FLOOR < abs(verdict.gap) <= MAX_TOLERANCE


def _gap(reference: Curve, run: Curve) -> float:
    """How much of the reference's progress the run gave back (+) or exceeded (-)."""
    progress = reference.start - reference.end
    if progress <= 0:
        return math.inf
    return (run.end - reference.end) / progress
