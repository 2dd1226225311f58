"""Exploring: take over what other studies measured alike, then propose, skip what is
known, probe in a child and record, until the stop rule (`tuning.stopping`) says stop.

Functions over the search run they serve (`RunContext`); `tuning.run` calls them.
"""

from __future__ import annotations

import dataclasses
import random
import time

from autotune.core.enums import Objective, Outcome
from autotune.core.errors import AutotuneError, StudyError
from autotune.core.parity import Arithmetic
from autotune.core.trial import Candidate, TrialConfig, TrialRecord, TrialResult
from autotune.core.units import format_duration
from autotune.store.queue import Asked, TrialLost
from autotune.tuning._context import RunContext
from autotune.tuning._memory_verdict import far_over_budget
from autotune.tuning._propose import Proposal, next_config
from autotune.tuning._skips import Skip, Verdictor, open_candidates, skip_reason
from autotune.tuning.deadline import Deadline
from autotune.tuning.guesses import fitted_guess
from autotune.tuning.rehearsal import job_failure, rehearse_first
from autotune.tuning.selection import (
    exportable,
    fitting,
    incumbent_cost,
    keeping_twin,
    recipe_arithmetic,
    twin_variants,
    verdict,
    verified,
)
from autotune.tuning.stopping import (
    TimeLeft,
    change_unconfirmable,
    last_probe,
    probe_cutoff_s,
    stop_reason,
)
from autotune.tuning.time_plan import plan_parity as planned_parity


def take_over(run: RunContext) -> None:
    """Record every config another study measured alike and this one has not (lever
    4: a rerun reuses every trial that fits, not only what its sampler proposes)."""
    if run.reuse is not None and len(run.reuse):
        for number, candidate, result in run.store.take_over(run.reuse.found, run.judge):
            run.observer.on_trial_end(number, candidate, result)


def explore(
    run: RunContext, deadline: Deadline, *, wait_for_others: bool, end: Deadline | None = None
) -> str:
    """Propose and probe until a limit stops it; returns why it stopped.

    `wait_for_others`: before stopping, wait for other workers' running trials (the
    finalists are chosen from every result), and go on if one of them died. `end`:
    the whole time budget's, which no probe may be expected to end past."""
    while True:
        run.store.queue.recover_stale(run.judge)  # a dead worker's trial goes back in the queue
        recs = run.store.records()
        failed = job_failure(recs) if run.rehearses else None
        if failed is not None:  # no config would pass its rehearsal: stop now
            return f"trial {failed.number}'s rehearsal failed in a way no config changes"
        if rehearse_first(run, recs, end or deadline):  # checks first: where the run
            continue  # evaluates, the first config that fits is rehearsed at once
        busy = run.store.queue.in_flight()
        over = far_over_budget(run.spec, recs)
        plan_parity(run, deadline, recs)
        left = TimeLeft.at(deadline, end)
        keep = _keeping_only(run, recs, left)
        last = last_probe(run.spec, run.limits, recs, busy, left, rehearses=run.rehearses)
        proposal = _proposal(run, recs, busy, over, keep, last=last)
        stop = stop_reason(
            run.spec,
            run.limits,
            recs,
            busy,
            over,
            left,
            run.store.settings.parity() if run.limits.parity_steps else None,
            rehearses=run.rehearses,
        ) or (proposal.why_stop if proposal and not busy else "")
        if not stop and keep and not busy and not _open(run, recs, over, busy, keep):
            stop = f"every config that keeps your precision and optimizer is measured: {keep}"
        if stop and busy and wait_for_others:
            while run.store.queue.in_flight():
                _pause(run)
            continue
        if stop:
            return stop
        if not _open(run, recs, over, busy, keep):
            _pause(run)  # what is left is being probed elsewhere
            continue
        if proposal and not run.store.queue.waiting():
            if proposal.candidate is None:  # the model would stop: see what the
                _pause(run)  # running probes (other workers') report first
                continue
            run.store.queue.enqueue(proposal.candidate)
        step(run, recs, busy, over, keep, end=end)


def _keeping_only(run: RunContext, recs: list[TrialRecord], left: TimeLeft) -> str:
    """Why only configs that keep the recipe's arithmetic (or a change parity verified)
    are worth probing now ('': all are; `stopping.change_unconfirmable`), said once.
    Only where such a config fits already: else the export is a change (selection takes
    the best that fits where none keeps the arithmetic), and the fastest is still to
    find (memory binds: the recipe's fp32 AdamW out of memory, bf16 or 8-bit fitting)."""
    keep = change_unconfirmable(run.spec, run.limits, recs, left.end_s)
    allowed = _allowed(run, recs)
    kept = [r for r in fitting(recs, run.spec.fit_limit_bytes) if exportable(r)]
    if keep and not any(Arithmetic.of(r.candidate) in allowed for r in kept):
        return ""
    if keep and "keeping only" not in run.said:  # its figures change as time runs down
        run.said.add("keeping only")
        recipe = recipe_arithmetic(run.spec)
        run.observer.on_plan(
            f"probing only configs that keep your arithmetic ({recipe.precision}, "
            f"{recipe.optimizer}): "
            f"{keep}; a longer --time-budget can weigh a change"
        )
    return keep


def _open(
    run: RunContext,
    recs: list[TrialRecord],
    over: Verdictor,
    busy: dict[Candidate, int],
    keep: str,
) -> list[Candidate]:
    """The configs still open (`open_candidates`); with `keep`, those that keep the
    recipe's arithmetic."""
    opened = open_candidates(run.spec.space, recs, over, busy)
    if not keep:
        return opened
    allowed = _allowed(run, recs)
    return [c for c in opened if Arithmetic.of(c) in allowed]


def _allowed(run: RunContext, recs: list[TrialRecord]) -> set[Arithmetic]:
    """The arithmetics an export may take without paired rounds: the recipe's, and
    those parity verified (`ok`) in this study."""
    recipe = recipe_arithmetic(run.spec)
    return {recipe} | {Arithmetic.of(r.candidate) for r in recs if verified(r, recipe)}


def plan_parity(
    run: RunContext, deadline: Deadline, recs: list[TrialRecord], *, final: bool = False
) -> None:
    """--parity auto: once the first guesses are measured (or the first rules 20-step
    runs out; `final`: exploring is over), the parity runs' length for the time left to
    explore (`deadline`). The study keeps it: a worker's or an earlier run's plan
    stands."""
    limits = run.limits
    if not limits.parity_auto:
        return
    plan = run.store.settings.parity_plan()
    if plan is not None:
        kind = f"{plan.steps}-step runs" if plan.steps else "the probes' own losses, unverified"
        said = f"parity: {kind}, as this study planned"
    else:
        top = limits.confirm_top if limits.parity_top is None else limits.parity_top
        plan = planned_parity(
            run.spec,
            recs,
            top=top,
            explore_left_s=deadline.left(),
            elapsed_s=time.monotonic() - run.started,
            explore_share=limits.search_share,
            final=final,
        )
        if plan is None:
            return
        plan = run.store.settings.save_parity_plan(plan)
        said = plan.why
    run.limits = dataclasses.replace(
        limits, parity_steps=plan.steps, parity_quick=plan.quick, parity_auto=False
    )
    if said:
        run.observer.on_plan(said)


def _proposal(
    run: RunContext,
    recs: list[TrialRecord],
    busy: dict[Candidate, int],
    over: Verdictor,
    keep: str = "",
    *,
    last: bool = False,
) -> Proposal | None:
    """--sampler model: the open config the model of step time finds most promising;
    first, a first guess the estimate ruled out, at a batch that fits (`fitted_guess`),
    then, where the best so far changes the recipe's arithmetic unverified, the same
    config with the recipe's precision and optimizer, which a tie would go to, or where
    memory shuts it, that config at the batch split or checkpointing that fits. With
    `keep`, only configs that keep the arithmetic; `last`: no probe may follow it."""
    if not run.limits.propose:
        return None
    opened = _open(run, recs, over, busy, keep)
    allowed = _allowed(run, recs) if keep else set()
    guess = fitted_guess(run.spec, recs, opened, over.fits, in_flight=busy, allowed=allowed)
    if guess is not None:
        return Proposal(guess)
    twin = keeping_twin(run.spec, recs)
    if twin is not None and twin in opened:
        return Proposal(twin)
    if twin is not None and twin not in busy and not twin_variants(run.spec, recs, twin, [*busy]):
        # shut for memory, and no worker probes it or a variant: the twin made to fit
        variants = [c for c in twin_variants(run.spec, recs, twin, opened) if over.fits(c)]
        if variants:  # the model's pick, else the one likeliest to run (no ckpt, largest)
            fitted = _next(run, recs, variants, over, last)
            return fitted if fitted.candidate else Proposal(min(variants, key=_lightest))
    return _next(run, recs, opened, over, last)


def _lightest(c: Candidate) -> tuple[int, int]:
    """The order a variant is tried in when the model proposes none: the least
    checkpointing, then the largest batch."""
    return c.activation_checkpointing.rank, -c.per_device_train_batch_size


def _next(
    run: RunContext, recs: list[TrialRecord], opened: list[Candidate], over: Verdictor, last: bool
) -> Proposal:
    return next_config(
        run.spec,
        recs,
        opened,
        fits=over.fits,
        concurrent=run.limits.concurrent,
        objective=run.limits.objective,
        last=last,
    )


def _pause(run: RunContext) -> None:
    """Wait while other workers' trials run; take over those whose worker died."""
    time.sleep(run.limits.poll_s)
    run.store.queue.recover_stale(run.judge)


def step(
    run: RunContext,
    recs: list[TrialRecord],
    busy: dict[Candidate, int],
    over: Verdictor,
    keep: str = "",
    *,
    end: Deadline | None = None,
) -> None:
    """Ask for one proposal; skip it or probe it (`keep`: skip a change of the recipe's
    arithmetic, with this reason; `end`: the whole time budget's deadline)."""
    asked = run.store.queue.ask()
    candidate, guess = asked.candidate, asked.first_guess
    skip = skip_reason(candidate, recs, run.spec.space, over, busy, first_guess=guess)
    changes = skip is None and keep and Arithmetic.of(candidate) not in _allowed(run, recs)
    if changes:
        skip = Skip(f"skipped: it changes your arithmetic, and {keep}", implies_oom=False)
    if skip is not None:
        result = TrialResult(Outcome.SKIPPED, reason=skip.reason)
        run.store.tell(asked, result, verdict(result, run.spec, implied=skip.implies_oom))
        # the user sees why a queued guess, or a config queued again, did not run
        if skip.implies_oom or guess or changes:
            run.observer.on_trial_end(asked.number, candidate, result)
        elif not run.store.queue.was_queued(asked):  # the sampler's repeat: steer the next ask
            _steer(run, asked.number, _open(run, recs, over, busy, keep))  # to one still open
        return
    config = run.trial_config(
        asked.number,
        candidate,
        str(asked.number),
        adaptive=run.limits.adaptive,
        incumbent_s=_incumbent(run, recs),
    )
    try:
        rival = run.store.queue.claim(asked, run.limits.max_trials, config.trial_dir)
    except TrialLost:  # another worker failed it and re-queued its config: ask again
        return
    if rival is not None:  # another worker got there first: let it run, pick again
        result = TrialResult(Outcome.SKIPPED, reason=rival)
        run.store.tell(asked, result, verdict(result, run.spec, implied=False))
        time.sleep(random.uniform(0.0, 0.5))  # two yielding workers do not retry in step
        return
    left = None if end is None else end.left()  # now, not when the loop began
    cutoff = probe_cutoff_s(run.spec, run.limits, recs, left, rehearses=run.rehearses)
    _probe(run, asked, config, cutoff)


def _steer(run: RunContext, number: int, remaining: list[Candidate]) -> None:
    if remaining:
        run.store.queue.enqueue(random.Random(run.spec.seed * 7919 + number).choice(remaining))


def _probe(
    run: RunContext, asked: Asked, config: TrialConfig, cutoff_s: float | None = None
) -> None:
    """Probe the asked config in a child and record its result. `cutoff_s`: the time
    budget stops it then (`stopping.probe_cutoff_s`); a probe it stops is failed and its
    config queued again, unmeasured, for a rerun with more time."""
    candidate = asked.candidate
    run.observer.on_trial_start(asked.number, candidate)
    own_s = run.limits.trial_timeout_s
    timeout_s = own_s if cutoff_s is None else min(cutoff_s, own_s)
    cut = timeout_s < own_s
    try:
        with run.store.queue.heartbeat(asked):
            # a fork server that must start first gets the probe's own limit, not the cut's
            result = run.launcher.run(config, timeout_s=timeout_s, ready_s=own_s)
    except BaseException as exc:  # Ctrl-C, SIGTERM, a full disk: fail the trial, keep the study
        why = str(exc) if isinstance(exc, AutotuneError) else f"interrupted ({type(exc).__name__})"
        run.store.queue.fail_and_requeue(asked, why)
        raise
    run.probes += 1
    if cut and result.outcome == Outcome.TIMEOUT:
        why = f"stopped at the end of the time budget after {format_duration(timeout_s)}"
        run.store.queue.fail_and_requeue(asked, f"{why}, unmeasured")
        run.observer.on_trial_end(
            asked.number, candidate, result.replace(reason=f"{why}; a rerun probes it")
        )
        return
    try:
        told = run.store.tell(asked, result, run.judge(result))
    except StudyError as exc:  # the storage stayed away: keep the result for the rerun
        try:
            kept = run.store.queue.keep_unrecorded(config.trial_dir, result)
        except OSError:  # the same full disk: the rerun probes the config again
            raise exc from None
        raise StudyError(f"{exc}; trial {asked.number}'s result is kept in {kept}") from None
    if not told:
        lost = "not recorded: another worker took the trial over while the storage was away"
        result = result.replace(reason=f"{result.reason}; {lost}".lstrip("; "))
    run.observer.on_trial_end(asked.number, candidate, result)


def _incumbent(run: RunContext, recs: list[TrialRecord]) -> float | None:
    """What a new probe is measured against (adaptive measurement): the best cost so
    far among comparable figures. None where a slower step may still win: ranking
    by throughput per GiB, or the user's data (a sampling order changes only the
    real batches, timed after the worst case)."""
    if not run.limits.adaptive or run.limits.objective != Objective.THROUGHPUT:
        return None
    if run.spec.data is not None:
        return None
    return incumbent_cost(
        recs,
        fit_limit_bytes=run.spec.fit_limit_bytes,
        train_steps=run.spec.train_steps,
        concurrent=run.limits.concurrent,
    )
