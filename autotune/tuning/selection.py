"""Selection: the fastest config that fits; among those within noise of it, the one that
keeps the user's arithmetic, then the least memory.

Fastest by the quiet step time (core/stats.py: the lower quartile of the measured steps,
which a slow spell of the host moves least); the figures shown stay the medians. A
change of precision or optimizer that parity did not verify is exported only when it is
significantly faster than the best config that keeps the recipe's arithmetic, in paired
rounds."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autotune.core.checkpointing import Checkpointing
from autotune.core.enums import Objective, Outcome, Precision
from autotune.core.errors import NoFitError
from autotune.core.optimizers import PLAIN
from autotune.core.parity import Arithmetic, changes
from autotune.core.parity_verdict import Status
from autotune.core.run_events import required
from autotune.core.spec import SearchSpec
from autotune.core.stats import SpeedRatio, paired_ratio, quiet_step_s, speed_ratio
from autotune.core.trial import Candidate, TrialRecord, TrialResult, Verdict
from autotune.core.units import format_size

MIN_NOISE = 0.01  # two configs closer than 1% are a tie even when both measured tight
MAX_NOISE = 0.10  # a noisy measurement never makes a config >10% slower count as a tie
RESOLVED = 0.02  # paired rounds whose interval lies within 1 +- this: a tie, settled
GIB = float(2**30)


def verdict(result: TrialResult, spec: SearchSpec, *, implied: bool) -> Verdict:
    """What a result tells the sampler. A config fits when its peak is within the budget
    less the headroom (the constraint <= 0); one measured (or, `implied`, known) not to be
    usable is a complete, infeasible point, which teaches the sampler to look elsewhere."""
    limit = spec.fit_limit_bytes / GIB
    peak = result.peak_memory_bytes
    if result.outcome == Outcome.OK and peak is not None:
        return Verdict((float(result.samples_per_s or 0.0), peak / GIB), peak / GIB - limit)
    if result.outcome in (Outcome.OOM, Outcome.UNSTABLE) or (
        result.outcome == Outcome.SKIPPED and implied
    ):
        worst = max(peak or 0, spec.memory_budget_bytes) / GIB
        return Verdict((0.0, worst), max((peak or 0) / GIB - limit, 0.0) + 1.0)
    # An error, a timeout, a redundant proposal: nothing to learn (a redundant one is pruned).
    return Verdict(None, None, pruned=result.outcome == Outcome.SKIPPED)


def fitting(records: Sequence[TrialRecord], fit_limit_bytes: int) -> list[TrialRecord]:
    """Trials that ran cleanly with a measured peak within the limit."""
    return [
        r
        for r in records
        if r.result.outcome == Outcome.OK
        and r.result.samples_per_s is not None
        and r.result.peak_memory_bytes is not None
        and r.result.peak_memory_bytes <= fit_limit_bytes
    ]


def select_best(
    records: Sequence[TrialRecord],
    *,
    fit_limit_bytes: int,
    objective: Objective = Objective.THROUGHPUT,
    train_steps: int = 0,
    recipe: Arithmetic | None = None,
) -> TrialRecord | None:
    """The record to export, or None when nothing fits (or learns like the recipe).

    With the user's run length (`train_steps`), the quickest to finish that run (one-time
    costs such as compilation + steps at the quiet step time) stands for the fastest.
    With the `recipe`'s arithmetic, a tie goes to a config that keeps it, and a change of
    it that parity did not verify (`unchecked`, `unverified`) is taken only where its gain
    over the best config that keeps it is significant (`unverified_gain`)."""
    pool = [r for r in fitting(records, fit_limit_bytes) if exportable(r)]
    if not pool:
        return None
    chosen = _best_of(pool, objective, train_steps, recipe)
    if recipe is None or verified(chosen, recipe):
        return chosen
    keeping = [r for r in pool if Arithmetic.of(r.candidate) == recipe]
    if not keeping:
        return chosen  # nothing keeps their arithmetic: the change, unverified, and said so
    alternative = _best_of(keeping, objective, train_steps, recipe)
    return chosen if significant(chosen, alternative, objective, train_steps) else alternative


def leader(
    spec: SearchSpec,
    records: Sequence[TrialRecord],
    objective: Objective = Objective.THROUGHPUT,
) -> TrialRecord | None:
    """The config selection would export if every gain it read were confirmed: the best,
    a tie going to the recipe's arithmetic, before an unverified change must show its
    gain in paired rounds. Where it changes the arithmetic unverified, the rounds that
    decide are between it and the best that keeps the arithmetic (`duel_pair`)."""
    pool = [r for r in fitting(records, spec.fit_limit_bytes) if exportable(r)]
    if not pool:
        return None
    return _best_of(pool, objective, spec.train_steps, recipe_arithmetic(spec))


def exportable(record: TrialRecord) -> bool:
    """Whether a config that fits may be exported: parity does not block it and its
    rehearsal (where run) did not fail."""
    if record.parity is not None and record.parity.blocks_export:
        return False
    return record.rehearsal is None or not record.rehearsal.blocks_export


def select_export(
    spec: SearchSpec,
    records: Sequence[TrialRecord],
    objective: Objective = Objective.THROUGHPUT,
    *,
    rehearse: bool = True,
) -> TrialRecord | None:
    """The record an export writes: `select_for` among the configs their rehearsal
    cleared (it passed, or was not needed) where the run evaluates or saves, unless the
    search was told --no-rehearse. No config is exported unrehearsed."""
    if required(spec, rehearse):
        records = [r for r in records if r.rehearsal is not None and r.rehearsal.clears]
    return select_for(spec, records, objective)


def select_for(
    spec: SearchSpec,
    records: Sequence[TrialRecord],
    objective: Objective = Objective.THROUGHPUT,
) -> TrialRecord | None:
    """The record a study exports: `select_best` with the study's fit limit, the user's
    run length and their recipe's arithmetic."""
    return select_best(
        records,
        fit_limit_bytes=spec.fit_limit_bytes,
        objective=objective,
        train_steps=spec.train_steps,
        recipe=recipe_arithmetic(spec),
    )


def _best_of(
    pool: Sequence[TrialRecord], objective: Objective, train_steps: int, recipe: Arithmetic | None
) -> TrialRecord:
    """The fastest (or most efficient, or quickest to finish the user's run); among those
    within noise of it, one that keeps the recipe's arithmetic, then the least memory.
    Under every objective a config its paired rounds found better beyond their noise
    leads instead, and rounds say what is a tie (`_tied`)."""

    def alters(r: TrialRecord) -> bool:
        return recipe is not None and Arithmetic.of(r.candidate) != recipe

    def lead(best: TrialRecord) -> TrialRecord:  # one its paired rounds found better
        return next((r for r in pool if _beats(r, best, objective, train_steps)), best)

    if objective == Objective.EFFICIENCY:
        best = lead(max(pool, key=lambda r: (efficiency(r), -r.number)))
        floor = efficiency(best) * (1.0 - noise_band(best))
        ties = [r for r in pool if _tied(best, r, objective, train_steps, efficiency(r) >= floor)]
        return min(ties, key=lambda r: (alters(r), -efficiency(r), r.number))
    if train_steps:
        quickest = lead(min(pool, key=lambda r: (finish_s(r, train_steps), r.number)))
        limit = finish_s(quickest, train_steps) * (1.0 + noise_band(quickest))
        ties = [
            r
            for r in pool
            if _tied(quickest, r, objective, train_steps, finish_s(r, train_steps) <= limit)
        ]
        return min(ties, key=lambda r: (alters(r), _peak(r), finish_s(r, train_steps), r.number))
    fastest = lead(max(pool, key=lambda r: (ranked_sps(r), -r.number)))
    floor = ranked_sps(fastest) * (1.0 - noise_band(fastest))
    ties = [r for r in pool if _tied(fastest, r, objective, 0, ranked_sps(r) >= floor)]
    return min(ties, key=lambda r: (alters(r), _peak(r), -ranked_sps(r), r.number))


def _beats(record: TrialRecord, other: TrialRecord, objective: Objective, train_steps: int) -> bool:
    """Paired rounds say `record` is better than `other` by the objective beyond their
    noise."""
    gain = paired_gain(record, other, objective, train_steps)
    return gain is not None and gain.low > 1.0


def _tied(
    best: TrialRecord, record: TrialRecord, objective: Objective, train_steps: int, near: bool
) -> bool:
    """Whether `record` is within the noise of the best: by the rounds they ran in side by
    side where they have two (their gain read by the objective), else as `near` says
    (within the best's noise band).

    By the rounds, two of one arithmetic tie on an edge not shown beyond 1%, as without
    them; two of different arithmetic only where the interval holds 1, the very reading
    that decides a change (`significant`) and ends its duel (`decided`). With the 1%
    there too, bf16 at 1.07x (1.01-1.14x over 3 paired rounds, the low end just under
    1.01) the fp32 recipe's speed was a tie here while the duel stopped on it as
    significant, and fp32 was exported (7 of 24 simulated t5 searches); under
    efficiency and a run length, rounds were not read at all, and a change whose pooled
    runs read level with the recipe stayed a tie whatever its rounds said."""
    gain = paired_gain(best, record, objective, train_steps) if record is not best else None
    if gain is None:
        return near
    same = Arithmetic.of(best.candidate) == Arithmetic.of(record.candidate)
    return gain.low <= 1.0 + (MIN_NOISE if same else 0.0)


def compare(faster: TrialRecord, slower: TrialRecord) -> SpeedRatio | None:
    """How many times faster one config is than another: from the rounds they ran in
    side by side where they have two, else from their pooled step times."""
    return paired_ratio(faster.rounds, slower.rounds) or speed_ratio(faster.result, slower.result)


def duel_pair(
    spec: SearchSpec, pool: Sequence[TrialRecord], objective: Objective
) -> tuple[TrialRecord, TrialRecord] | None:
    """The two finalists the export hinges on: where the leader (`leader`) changes the
    recipe's arithmetic unverified, it and the best config that keeps the arithmetic
    (whether its gain, confirmed in paired rounds, is significant decides); else the
    config selection exports and its strongest rival by the objective (whether one is
    better decides). Under every objective. None with fewer than two."""
    recipe = recipe_arithmetic(spec)
    ahead = leader(spec, pool, objective)
    if ahead is None:
        return None
    keeping = [r for r in pool if Arithmetic.of(r.candidate) == recipe and r != ahead]
    if not verified(ahead, recipe) and keeping:
        return ahead, _best_of(keeping, objective, spec.train_steps, recipe)
    chosen = select_for(spec, pool, objective)
    if chosen is None:
        return None
    rivals = [r for r in by_objective(pool, objective, spec.train_steps) if r != chosen]
    return (chosen, rivals[0]) if rivals else None


def by_objective(
    records: Sequence[TrialRecord], objective: Objective, train_steps: int = 0
) -> list[TrialRecord]:
    """Best first by what selection minimises (`record_cost`): the step time, the time to
    finish the user's run, or the cost per GiB of peak; those without a cost last."""
    costs = {r.number: record_cost(r, train_steps, objective) for r in records}
    return sorted(
        records, key=lambda r: (costs[r.number] is None, costs[r.number] or 0.0, r.number)
    )


def decided(a: TrialRecord, b: TrialRecord, spec: SearchSpec, objective: Objective) -> bool:
    """Whether the duel between `a` and `b` (`duel_pair`) is over, by the objective: once
    more rounds cannot move the export by more than `RESOLVED`.

    Where `a` changes the recipe's arithmetic unverified and `b` keeps it, `a` is
    exported only on a significant gain over `b`, and only paired rounds decide: their
    interval of its gain leaves out 1, or puts the gain at most `RESOLVED`. Else `a` is
    the export and `b` the rival it would yield to: the duel is over when their
    comparison is settled (`settled`; for two of the same arithmetic from their runs too
    where they have no rounds), or their rounds put the rival at most `RESOLVED` ahead.
    How much the export beats its rival, or the keeping config the change, cannot move
    the export: a tie read 0.95-1.015x went on to more rounds that could at most find a
    gain under 2% (issue #68: a confirmation that cannot change the export is not run)."""
    gain = paired_gain(a, b, objective, spec.train_steps)
    if _challenges(a, b, spec):
        return gain is not None and (not gain.tie or gain.high <= 1 + RESOLVED)
    if gain is not None and gain.low >= 1 - RESOLVED:
        return True
    if Arithmetic.of(a.candidate) == Arithmetic.of(b.candidate):
        return settled(
            gain
            or _by_objective(speed_ratio(a.result, b.result), a, b, objective, spec.train_steps)
        )
    return gain is not None and settled(gain)


def reads_ahead(a: TrialRecord, b: TrialRecord, spec: SearchSpec, objective: Objective) -> bool:
    """Whether the rounds of a duel (`duel_pair`) read the config that would displace the
    export ahead by more than `RESOLVED`, not yet significantly: the change (`a`) ahead
    of the config keeping the arithmetic, or the rival (`b`) ahead of the export. A gain
    more rounds may confirm, where a tie's rounds have nothing left to find."""
    gain = paired_gain(a, b, objective, spec.train_steps)
    if gain is None or not gain.tie:
        return False
    if _challenges(a, b, spec):
        return gain.value > 1 + RESOLVED
    return gain.value < 1 - RESOLVED


def _challenges(a: TrialRecord, b: TrialRecord, spec: SearchSpec) -> bool:
    """Whether `a` changes the recipe's arithmetic unverified and `b` keeps it: the duel
    between them is whether `a`'s gain is significant, where in any other pair `a` is the
    export and `b` its rival (`duel_pair`)."""
    recipe = recipe_arithmetic(spec)
    return not verified(a, recipe) and Arithmetic.of(b.candidate) == recipe


def paired_gain(
    chosen: TrialRecord, other: TrialRecord, objective: Objective, train_steps: int = 0
) -> SpeedRatio | None:
    """How many times better `chosen` is than `other` by the objective, from the rounds
    they ran in side by side (None without two)."""
    paired = paired_ratio(chosen.rounds, other.rounds)
    return _by_objective(paired, chosen, other, objective, train_steps) if paired else None


def _by_objective(
    speed: SpeedRatio | None,
    chosen: TrialRecord,
    other: TrialRecord,
    objective: Objective,
    train_steps: int,
) -> SpeedRatio | None:
    """A speed ratio of `chosen` over `other` as the objective reads it: itself; per GiB
    of peak (efficiency: each peak is measured, the speed is what drifts); or the time
    to finish the user's run, one-time costs included (the ratio times the steps)."""
    if speed is None:
        return None
    if objective == Objective.EFFICIENCY:
        k = _peak(other) / max(_peak(chosen), 1.0)
        return SpeedRatio(speed.value * k, speed.low * k, speed.high * k, speed.rounds)
    step_s = quiet_step_s(chosen.result)
    if not train_steps or not step_s:
        return speed
    mine = (chosen.result.one_time_s or 0.0) + train_steps * step_s
    once = other.result.one_time_s or 0.0

    def theirs(ratio: float) -> float:  # `other`'s steps are `ratio` times `chosen`'s
        return (once + train_steps * step_s * ratio) / mine

    return SpeedRatio(theirs(speed.value), theirs(speed.low), theirs(speed.high), speed.rounds)


def settled(ratio: SpeedRatio | None) -> bool:
    """Whether a comparison of two configs of the same arithmetic is decided: its
    interval leaves out 1 (one is faster), or, from paired rounds, lies within
    1 +- `RESOLVED` (a tie)."""
    if ratio is None:
        return False
    if not ratio.tie:
        return True
    return ratio.rounds >= 2 and 1 - RESOLVED <= ratio.low and ratio.high <= 1 + RESOLVED


def verified(record: TrialRecord, recipe: Arithmetic) -> bool:
    """Whether the record trains like the recipe: its arithmetic, or a change parity
    found learning alike (`ok`)."""
    if Arithmetic.of(record.candidate) == recipe:
        return True
    return record.parity is not None and record.parity.status == Status.OK


def significant(
    chosen: TrialRecord, other: TrialRecord, objective: Objective, train_steps: int = 0
) -> bool:
    """Whether `chosen`, which changes the recipe's arithmetic unverified, beats `other`
    beyond the noise: only paired rounds tell, the two timed side by side in alternating
    order, their interval of its gain by the objective above 1 (`paired_gain`). Runs not
    side by side never do: on two processes one probe read a bf16 Adafactor config 1.33x
    (1.28-1.43x over its steps) the best fp32 one, while another config of that search
    read 27% slower in its confirmation than in its probe."""
    gain = paired_gain(chosen, other, objective, train_steps)
    return gain is not None and gain.low > 1.0


def unverified_note(spec: SearchSpec, records: Sequence[TrialRecord], chosen: TrialRecord) -> str:
    """One line on why a change of the recipe's arithmetic that parity did not verify
    is the export: its significant gain over the best config that keeps the arithmetic,
    or that none keeping it fits; "" for an export that keeps it or was verified."""
    recipe = recipe_arithmetic(spec)
    if verified(chosen, recipe):
        return ""
    keeping = [
        r
        for r in fitting(records, spec.fit_limit_bytes)
        if Arithmetic.of(r.candidate) == recipe and exportable(r)
    ]
    if not keeping:
        tried = [
            r
            for r in records
            if Arithmetic.of(r.candidate) == recipe and r.result.outcome != Outcome.SKIPPED
        ]
        if not tried:
            return (
                "exported without verified parity: no config that keeps your recipe's "
                "precision and optimizer was measured before the time budget ran out"
            )
        said = "; ".join(
            f"trial {r.number}, {r.candidate.describe()}: {_unfit(r, spec)}" for r in tried[:3]
        )
        more = f" and {len(tried) - 3} more" if len(tried) > 3 else ""
        return (
            "exported without verified parity: none of the configs that keep your recipe's "
            f"precision and optimizer it measured fit ({said}{more})"
        )
    other = _best_of(keeping, Objective.THROUGHPUT, spec.train_steps, recipe)
    ratio = compare(chosen, other)
    gain = ratio.describe() if ratio else "faster"
    return (
        f"exported without verified parity for its gain: {gain} the speed of trial "
        f"{other.number} ({other.candidate.describe()}), the best that keeps your arithmetic"
    )


def _unfit(record: TrialRecord, spec: SearchSpec) -> str:
    """Why a measured config is not among those that fit, in words."""
    outcome = record.result.outcome
    peak = record.result.peak_memory_bytes
    if outcome == Outcome.OOM:
        return "out of memory"
    if outcome == Outcome.OK and peak is not None and peak > spec.fit_limit_bytes:
        return f"peak {format_size(peak)}, over the {format_size(spec.fit_limit_bytes)} it may use"
    if outcome == Outcome.OK and record.rehearsal is not None and record.rehearsal.blocks_export:
        return "its rehearsal failed"
    if outcome == Outcome.OK:
        return "no speed or peak measured"
    return str(outcome)


def kept_note(spec: SearchSpec, records: Sequence[TrialRecord], chosen: TrialRecord) -> str:
    """One line where the export keeps the recipe's arithmetic although a config that
    changes it read faster: the tie rule's choice, said with the gain that did not count
    (not beyond the noise of its runs) and what the change would alter, unverified; ""
    where the recipe's arithmetic did not decide the export. Without it a one-minute
    search that kept the user's fp32 AdamW over a bf16 probe 1.16x faster said "nothing
    changed"."""
    recipe = recipe_arithmetic(spec)
    if Arithmetic.of(chosen.candidate) != recipe:
        return ""
    # what selection would export if the recipe's arithmetic counted for nothing
    faster = select_best(
        records, fit_limit_bytes=spec.fit_limit_bytes, train_steps=spec.train_steps
    )
    if faster is None or Arithmetic.of(faster.candidate) == recipe:
        return ""
    ratio = compare(faster, chosen)
    if ratio is None or ratio.value <= 1.0:
        return ""
    runs = (
        "in paired rounds, not a significant gain"
        if ratio.rounds
        else "in separate runs, a gain not confirmed in paired rounds"
    )
    what = [
        c.describe() for c in changes(chosen.candidate, faster.candidate) if not c.keeps_arithmetic
    ]
    status = faster.parity.status if faster.parity is not None else Status.UNCHECKED
    left = "" if status == Status.OK else f", which parity left {status}"
    return (
        f"kept your arithmetic: trial {faster.number} ({faster.candidate.describe()}) read "
        f"{ratio.describe()} its speed {runs} for its change "
        f"({'; '.join(what) or 'of arithmetic'}){left}; --parity on or a longer "
        "--time-budget can settle it"
    )


def keeping_twin(spec: SearchSpec, records: Sequence[TrialRecord]) -> Candidate | None:
    """The best so far with the recipe's precision, optimizer and samples a step, where
    the best changes them and parity has not verified that: the config a tie would go
    to, measured beside it so that the gain of the change is weighed against its own
    batch split and levers, not against whichever arithmetic-keeping config happened to
    be probed."""
    best = leader(spec, records)
    recipe = recipe_arithmetic(spec)
    if best is None or verified(best, recipe):
        return None
    twin = dataclasses.replace(
        best.candidate.keeping_samples(), precision=recipe.precision, optim=spec.recipe.optim
    )
    return twin if Arithmetic.of(twin) == recipe else None


def keeping(spec: SearchSpec, candidate: Candidate) -> Candidate | None:
    """The candidate made to keep the recipe's arithmetic: the recipe's precision and
    samples a step, its own optimizer where that keeps the recipe's update (fused AdamW
    for AdamW), else the recipe's; its batch and levers kept. None where no such config
    keeps it (another engine's precision)."""
    recipe = recipe_arithmetic(spec)
    kept = dataclasses.replace(candidate.keeping_samples(), precision=recipe.precision)
    if Arithmetic.of(kept) != recipe:
        kept = dataclasses.replace(kept, optim=spec.recipe.optim)
    return kept if Arithmetic.of(kept) == recipe else None


def twin_variants(
    spec: SearchSpec,
    records: Sequence[TrialRecord],
    twin: Candidate,
    open_configs: Sequence[Candidate],
) -> list[Candidate]:
    """Where the keeping twin is shut (its family out of memory, or the estimate rules it
    out) and no config that keeps the recipe's arithmetic fits yet: the open configs that
    differ from the twin only in the memory it takes, its batch split and checkpointing
    level. A change is weighed against one of them, not exported for want of one: on an
    H200 a 1.24B Llama's 2-minute searches measured fp32 only at the plain default (out
    of memory), never checkpointed, and exported bf16 saying no fp32 config fit."""
    recipe = recipe_arithmetic(spec)
    if any(
        Arithmetic.of(r.candidate) == recipe and exportable(r)
        for r in fitting(records, spec.fit_limit_bytes)
    ):
        return []

    def as_twin(c: Candidate) -> Candidate:
        return dataclasses.replace(
            c,
            per_device_train_batch_size=twin.per_device_train_batch_size,
            gradient_accumulation_steps=twin.gradient_accumulation_steps,
            activation_checkpointing=twin.activation_checkpointing,
        )

    return [c for c in open_configs if c != twin and as_twin(c) == twin]


def recipe_arithmetic(spec: SearchSpec) -> Arithmetic:
    """The arithmetic of the user's recipe: their precision and optimizer (from
    --base-args, over their arguments class's defaults), fp32 AdamW where they set
    neither; `as-loaded` where their job holds its weights in 16 bits or quantized."""
    precision = spec.recipe.precision
    if precision == Precision.FP32 and Precision.AS_LOADED in spec.space.precisions:
        precision = Precision.AS_LOADED  # no autocast on their job: its weights' dtype
    return Arithmetic.of(Candidate(8, 1, precision, Checkpointing.OFF, spec.recipe.optim))


def efficiency(record: TrialRecord) -> float:
    """Samples/s (at the quiet step time) per GiB of peak."""
    return ranked_sps(record) / max(_peak(record), 1.0) * GIB


def ranked(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """Best first: ok by throughput (at the quiet step time), then the rest by outcome."""
    order = {o: i for i, o in enumerate(Outcome)}
    return sorted(records, key=lambda r: (order[r.result.outcome], -ranked_sps(r), r.number))


def record_cost(
    record: TrialRecord, train_steps: int, objective: Objective = Objective.THROUGHPUT
) -> float | None:
    """What selection minimises, in one figure: the step time (the global batch is
    fixed), the time to finish the user's run, or per GiB of peak (efficiency)."""
    result = record.result
    step_s = quiet_step_s(result)
    if result.outcome != Outcome.OK or not step_s:
        return None
    if objective == Objective.EFFICIENCY:
        return step_s * (result.peak_memory_bytes or GIB) / GIB
    return finish_s(record, train_steps) if train_steps else step_s


def incumbent_cost(
    records: Sequence[TrialRecord],
    *,
    fit_limit_bytes: int,
    train_steps: int,
    concurrent: int,
    objective: Objective = Objective.THROUGHPUT,
) -> float | None:
    """The best so far, as a new probe is compared with it: the least cost (record_cost)
    among configs that fit, may be exported, and were measured with as many probes
    sharing the machine."""
    costs = [
        cost
        for r in fitting(records, fit_limit_bytes)
        if r.result.concurrent == concurrent
        and exportable(r)
        and (cost := record_cost(r, train_steps, objective)) is not None
    ]
    return min(costs) if costs else None


def noise_band(record: TrialRecord) -> float:
    """Relative uncertainty of a config's measured speed: the IQR/median of its steps
    over sqrt(steps), the band within which two configs are a tie."""
    steps = max(1, len(record.result.step_times_s))
    spread = record.result.step_time_spread or 0.0
    return float(min(MAX_NOISE, max(MIN_NOISE, spread / steps**0.5)))


def finish_s(record: TrialRecord, train_steps: int) -> float:
    """Seconds to finish the user's run of `train_steps` optimizer steps, as ranked: the
    one-time cost + the steps at the quiet step time."""
    step_s = quiet_step_s(record.result)
    if step_s is None:
        return float("inf")
    return (record.result.one_time_s or 0.0) + train_steps * step_s


def ranked_sps(record: TrialRecord) -> float:
    """Samples/s at the quiet step time, as configs are ranked (the measured figure
    where that is not known)."""
    result = record.result
    step_s = quiet_step_s(result)
    if not result.samples_per_s or not result.step_time_median_s or not step_s:
        return float(result.samples_per_s or 0.0)
    return result.samples_per_s * result.step_time_median_s / step_s


def _peak(record: TrialRecord) -> float:
    return float(record.result.peak_memory_bytes or 0)


def nothing_fits(recs: list[TrialRecord], spec: SearchSpec, *, rehearse: bool = True) -> NoFitError:
    """The one-line report when no config fits: the smallest peak seen and what to try."""
    fits = fitting(recs, spec.fit_limit_bytes)
    failed = [r for r in fits if r.rehearsal is not None and r.rehearsal.blocks_export]
    if failed:  # they train within the budget, but their run's other events do not
        first = failed[0]
        assert first.rehearsal is not None
        return NoFitError(
            f"{len(failed)} config(s) train within the budget but fail the rehearsal of "
            f"your run's evaluation and save; trial {first.number}'s "
            f"{first.rehearsal.describe()}; raise --memory-budget, or change the settings "
            "of that event in --base-args"
        )
    unrehearsed = select_for(spec, recs)
    if unrehearsed is not None and required(spec, rehearse):  # fits, and not rehearsed yet
        return NoFitError(
            f"trial {unrehearsed.number} fits, but no config has been rehearsed against your "
            "run's evaluation and checkpoint saves yet, and none is exported before it is: "
            "run the search again (it resumes the study and rehearses it), or pass "
            "--no-rehearse to it"
        )
    if fits:  # they fit, but none learns like the recipe
        return NoFitError(
            f"every config that fits ({len(fits)}) learns differently from your recipe "
            "(training parity: see `autotune show`); allow your recipe's precision and "
            "optimizer (--precisions, --optimizers) or pass --parity off to export anyway"
        )
    held = [
        int(r.result.baseline["vmdata_bytes"])
        for r in recs
        if r.result.outcome == Outcome.OOM
        and r.result.baseline.get("vmdata_bytes", 0) > spec.fit_limit_bytes
    ]
    if held and len(held) == sum(r.result.outcome == Outcome.OOM for r in recs):
        return NoFitError(
            f"no config fits {format_size(spec.fit_limit_bytes)} (budget "
            f"{format_size(spec.memory_budget_bytes)} less headroom): a probe process holds "
            f"{format_size(min(held))} after importing torch and transformers, before any "
            "training; pass a --memory-budget well above that"
        )
    peaks = [r.result.peak_memory_bytes for r in recs if r.result.peak_memory_bytes]
    counts: dict[str, int] = {}
    for r in recs:
        counts[r.result.outcome.value] = counts.get(r.result.outcome.value, 0) + 1
    seen = ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no trials"
    smallest = f"; smallest peak measured {format_size(min(peaks))}" if peaks else ""
    return NoFitError(
        f"no config fits {format_size(spec.fit_limit_bytes)} (budget "
        f"{format_size(spec.memory_budget_bytes)} less headroom): {seen}{smallest}; try a larger "
        "--memory-budget, --optimizers adamw_bnb_8bit or adafactor, --checkpointing on, "
        "a shorter --seq-len or a smaller --global-batch-size"
    )


def plain_default(records: Sequence[TrialRecord], spec: SearchSpec) -> TrialRecord | None:
    """The measured plain default: no autocast (fp32, or as-loaded on a job held in 16
    bits), adamw_torch, no checkpointing (unless the job forces it), smallest regular
    batch."""
    space = spec.space
    precision = Precision.AS_LOADED if Precision.AS_LOADED in space.precisions else Precision.FP32
    checkpointed = space.plain_checkpointing  # off, unless the user's job forces it on
    wanted = (precision, PLAIN, checkpointed, space.micro_batches[0])
    for r in records:
        c = r.candidate
        plain = (c.precision, c.optim, c.activation_checkpointing, c.per_device_train_batch_size)
        if plain == wanted and not c.levers.changes_samples and r.result.outcome == Outcome.OK:
            return r
    return None
