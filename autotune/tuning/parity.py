"""Parity in the parent: between exploring and confirming (and again after confirming
reorders the finalists), before selection; within the time budget, which exploring
leaves the runs' expected time (`reserved_s`).

For every finalist whose arithmetic (precision, optimizer update) differs from the
user's recipe, one parity run of that arithmetic is compared with a run of the recipe
itself (the reference) and with the reference under another batch split (the twin,
which calibrates the tolerance). Each run is a child process like a probe. Verdicts are
stored in the study; a diverged arithmetic is never selected, so the search goes down
the ranking until the finalists are settled.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from autotune.core.checkpointing import Checkpointing
from autotune.core.enums import Objective, Outcome
from autotune.core.parity import (
    EVAL_SAMPLES,
    PARITY_LR,
    POINTS,
    Arithmetic,
    Curve,
    judge,
    judge_probes,
    needs_twin,
    probe_curve,
    tolerance,
)
from autotune.core.parity_state import ParityState
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialRecord, TrialResult
from autotune.core.units import format_duration
from autotune.system import devices as device
from autotune.tuning._context import RunContext
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.tuning.selection import (
    fitting,
    plain_default,
    ranked,
    recipe_arithmetic,
    select_for,
)


def reference_candidate(spec: SearchSpec, records: Sequence[TrialRecord]) -> Candidate:
    """The user's recipe: their precision, optimizer, checkpointing and micro-batch from
    --base-args, else fp32 plain AdamW without checkpointing at the largest micro-batch
    that ran within the budget with that arithmetic. Their micro-batch is replaced (by
    the largest that fits) only when it was measured out of memory. Per process, as the
    study's candidates are."""
    arithmetic = recipe_arithmetic(spec)
    precision, optim = arithmetic.precision, spec.recipe.optim
    ckpt = spec.recipe.checkpointing(spec.checkpointing_field)
    if ckpt not in spec.space.checkpointing:  # their job turns it on whatever they say
        ckpt = min(spec.space.checkpointing, key=lambda c: abs(c.rank - ckpt.rank))
    per_process = spec.space.global_batch_size
    micro = spec.recipe.micro_batch
    if micro is not None and per_process % micro == 0:
        yours = spec.space.candidate(micro, precision, ckpt, optim)
        out_of_memory = any(
            r.candidate == yours and r.result.outcome == Outcome.OOM for r in records
        )
        if not out_of_memory:
            return yours
    fits = [
        r.candidate
        for r in fitting(records, spec.fit_limit_bytes)
        if Arithmetic.of(r.candidate) == arithmetic
    ]
    if fits:  # the largest micro-batch that fits, at their checkpointing where it fits so
        best = max(
            fits,
            key=lambda c: (
                c.per_device_train_batch_size,
                -abs(c.activation_checkpointing.rank - ckpt.rank),
            ),
        )
        return spec.space.candidate(
            best.per_device_train_batch_size, precision, best.activation_checkpointing, optim
        )
    smallest = min(spec.space.micro_batches)
    on = Checkpointing.ON if Checkpointing.ON in spec.space.checkpointing else ckpt
    return spec.space.candidate(smallest, precision, ckpt or on, optim)


def twin_of(spec: SearchSpec, reference: Candidate) -> Candidate | None:
    """The reference under another batch split (what rounding alone does), or None."""
    micro = reference.per_device_train_batch_size
    for other in (micro // 2, micro * 2):
        if other >= 1 and spec.space.global_batch_size % other == 0:
            return dataclasses.replace(
                reference,
                per_device_train_batch_size=other,
                gradient_accumulation_steps=spec.space.global_batch_size // other,
            )
    return None


def single_process(spec: SearchSpec, candidate: Candidate) -> Candidate:
    """A parity run is one process: the global batch is micro-batch x accumulation."""
    accumulation = spec.global_batch_size // candidate.per_device_train_batch_size
    return dataclasses.replace(candidate, gradient_accumulation_steps=accumulation)


def learning_rate(spec: SearchSpec) -> float:
    value = spec.base_arguments.get("learning_rate")
    return float(value) if isinstance(value, (int, float)) and value > 0 else PARITY_LR


class ParityCheck:
    """Runs what the finalists' verdicts need and stores them (`run`: the search run whose
    launcher and folders the runs use)."""

    def __init__(self, run: RunContext, limits: SearchLimits) -> None:
        self.run = run
        self.store = run.store
        self.spec = run.spec
        self.steps = limits.parity_steps
        self.top = max(1, limits.confirm_top)
        self.objective = limits.objective
        self.quick = limits.parity_quick  # unverified verdicts may be exported
        self.said: set[str] = set()  # arithmetics whose probe verdict the observer heard

    def settle(self, deadline: Deadline | None = None) -> ParityState:
        """Judge the finalists' arithmetics (the top by speed and the one selection would
        export) until every one of them has a verdict: by parity runs, or (no runs
        planned: `steps` 0) from the probes' own losses. A run expected to end past the
        `deadline` does not start: its arithmetic stays unchecked, and that is said."""
        records = self.store.records()
        if not self.steps:
            return self._from_probes(records)
        wanted = ParityState(
            reference_candidate(self.spec, records),
            self.steps,
            learning_rate(self.spec),
            self.spec.seed,
        )
        stored = self.store.settings.parity()
        state = stored.retrying() if stored and stored.same_setup(wanted) else wanted
        if state is wanted and self.run.reuse is not None:  # another study's, made alike
            taken = self.run.reuse.parity_runs(wanted)
            if taken is not None:
                state = taken[1]
                runs = sorted(state.curves, key=lambda k: (k != "reference", k))
                self.run.observer.on_parity_reused(taken[0], [k.replace("|", " ") for k in runs])
        state = dataclasses.replace(state, quick=self.quick)  # this search's policy
        self.store.settings.save_parity(state)  # also when no run is needed: the check was on
        arithmetics = len(self.spec.space.precisions) * len(self.spec.space.optimizers)
        for _ in range(arithmetics + 1):
            todo = self._unjudged(state, self.store.records())
            if todo is None:
                break
            left = deadline.left() if deadline is not None else None
            if left is not None and (need := self._expected_s(state, todo)) > left:
                self.run.observer.on_plan(
                    f"parity: no run for {Arithmetic.of(todo).key.replace('|', ' ')}: its runs "
                    f"take about {format_duration(need)} and {format_duration(left)} of the "
                    "time budget is left; unchecked"
                )
                break
            state = self._judge(state, todo)
            self.store.settings.save_parity(state)
        return state

    def _from_probes(self, records: Sequence[TrialRecord]) -> ParityState:
        """Every measured arithmetic judged from its probe's losses against the recipe's
        probe: no run, so recomputed as the probes grow; each finalist's verdict said
        once."""
        state = dataclasses.replace(probe_state(self.spec, records), quick=self.quick)
        self.store.settings.save_parity(state)
        for candidate in unjudged(
            self.spec, ParityState(state.reference, 0, 0.0), records, self.top, self.objective
        ):
            key = Arithmetic.of(candidate).key
            if key in state.verdicts and key not in self.said:
                self.said.add(key)
                self.run.observer.on_parity(candidate, state.verdicts[key])
        return state

    def _expected_s(self, state: ParityState, candidate: Candidate) -> float:
        """The runs judging `candidate` would make, as `reserved_s` times them: its
        arithmetic's quickest config and the reference's where not run yet, the twin
        itself, each with the held-out evaluations at the reference's step."""
        records, limit = self.store.records(), self.spec.fit_limit_bytes
        measured = {r.candidate: r.result for r in fitting(records, limit)}
        reference = measured.get(quickest_alike(state.reference, records, limit, self.steps))
        runs = [quickest_alike(candidate, records, limit, self.steps)]
        if "reference" not in state.curves:
            runs.append(quickest_alike(state.reference, records, limit, self.steps))
        twin = twin_of(self.spec, state.reference)
        if "twin" not in state.curves and twin is not None:
            runs.append(twin)
        evaluations = evaluation_s(self.spec, self.steps, reference) if reference else 0.0
        return sum(
            run_s(measured[c], self.steps, self.spec.processes) + evaluations
            for c in runs
            if c in measured
        )

    def _unjudged(self, state: ParityState, records: Sequence[TrialRecord]) -> Candidate | None:
        """A finalist whose arithmetic has no verdict yet, best first."""
        return next(iter(unjudged(self.spec, state, records, self.top, self.objective)), None)

    def _judge(self, state: ParityState, candidate: Candidate) -> ParityState:
        """Run the reference (once) and the candidate's arithmetic; run the twin only when
        the verdict depends on it: the tolerance is at least the floor and at most the
        cap, so a gap inside the floor passes and one beyond the cap fails whatever the
        twin would show."""
        curves = dict(state.curves)
        records = self.store.records()
        if "reference" not in curves:  # the recipe's arithmetic, as quickly as measured
            alike = quickest_alike(state.reference, records, self.spec.fit_limit_bytes, self.steps)
            curves["reference"] = self._curve("reference", alike)
        key = Arithmetic.of(candidate).key
        trained = quickest_alike(candidate, records, self.spec.fit_limit_bytes, self.steps)
        curves[key] = self._curve(key.replace("|", "-"), trained)
        tol = tolerance(curves["reference"], curves.get("twin"))
        verdict = judge(curves["reference"], curves[key], tol)
        twin = twin_of(self.spec, state.reference)
        if "twin" not in curves and twin is not None and needs_twin(verdict):
            curves["twin"] = self._curve("twin", twin)
            tol = tolerance(curves["reference"], curves["twin"])
            verdict = judge(curves["reference"], curves[key], tol)
        self.run.observer.on_parity(candidate, verdict)
        return dataclasses.replace(
            state, curves=curves, tolerance=tol, verdicts={**state.verdicts, key: verdict}
        )

    def _curve(self, label: str, candidate: Candidate) -> Curve:
        run, spec = self.run, self.spec
        single = single_process(spec, candidate)
        folder = f"parity-{label}-{time.strftime('%Y%m%d-%H%M%S')}"
        config = run.trial_config(-1, single, folder, concurrent=1)
        torch_device, visible = device.placement(spec.device, 1)
        config = dataclasses.replace(
            config,
            parity_steps=self.steps,
            nproc_per_node=1,
            nnodes=1,
            device=torch_device,
            visible_devices=visible,
        )
        probe_steps = spec.warmup_steps + spec.measure_steps
        # One process does the work of nproc_per_node, for more steps than a probe.
        scale = spec.processes * max(1.0, self.steps / probe_steps)
        run.observer.on_parity_start(label, candidate)
        result: TrialResult = run.launcher.run(config, timeout_s=run.limits.trial_timeout_s * scale)
        return Curve.of(result, self.steps)


def probe_state(spec: SearchSpec, records: Sequence[TrialRecord]) -> ParityState:
    """Parity judged from the probes themselves (`steps` 0): every probe of a study
    trains from the same weights on the same batches in the same order, so the probe
    of the recipe's arithmetic (the recipe's own, where measured) is the reference,
    one of that arithmetic under another batch split the twin, and each other
    arithmetic's longest probe (in the same sampling order) is judged against them."""
    reference = reference_candidate(spec, records)
    state = ParityState(reference, 0, learning_rate(spec), spec.seed)
    fits = [r for r in fitting(records, spec.fit_limit_bytes) if r.result.step_losses]
    recipe = Arithmetic.of(reference)
    alike = sorted(
        (r for r in fits if Arithmetic.of(r.candidate) == recipe),
        # the longest (a probe cut short as clearly slower has few losses), the recipe's
        # own split first among equals
        key=lambda r: (-len(r.result.step_losses), r.candidate != reference, r.number),
    )
    if not alike:
        return state
    ref = alike[0]
    order = ref.candidate.train_sampling_strategy
    split = ref.candidate.per_device_train_batch_size
    twins = [
        r.result.step_losses
        for r in alike
        if r.candidate.per_device_train_batch_size != split
        and r.candidate.train_sampling_strategy == order
    ]
    twin = max(twins, key=len, default=())
    longest: dict[Arithmetic, TrialRecord] = {}
    for r in fits:
        key = Arithmetic.of(r.candidate)
        if key == recipe or key.packed or r.candidate.train_sampling_strategy != order:
            continue  # a packed probe trained other batches: its verdict stands unpaired
        if key not in longest or len(r.result.step_losses) > len(longest[key].result.step_losses):
            longest[key] = r
    verdicts, curves, tol = {}, {}, None
    for key, record in longest.items():
        verdicts[key.key], judged_tol = judge_probes(
            ref.result.step_losses, record.result.step_losses, twin
        )
        steps = verdicts[key.key].steps
        curves[key.key] = probe_curve(record.result.step_losses, steps)
        tol = judged_tol or tol
    steps = max((v.steps for v in verdicts.values()), default=len(ref.result.step_losses))
    curves["reference"] = probe_curve(ref.result.step_losses, steps)
    if twin:
        curves["twin"] = probe_curve(twin, min(steps, len(twin)))
    return dataclasses.replace(state, curves=curves, verdicts=verdicts, tolerance=tol)


def unjudged(
    spec: SearchSpec,
    state: ParityState,
    records: Sequence[TrialRecord],
    top: int,
    objective: Objective,
) -> list[Candidate]:
    """The finalists (the one selection would export, then the top by speed) whose
    arithmetic has no verdict yet, best first."""
    fits = fitting(records, spec.fit_limit_bytes)
    pool = [r for r in fits if not ((v := state.verdict(r.candidate)) and v.blocks_export)]
    judged = [dataclasses.replace(r, parity=state.verdict(r.candidate)) for r in pool]
    chosen = select_for(spec, judged, objective)
    return [
        record.candidate
        for record in [*([chosen] if chosen else []), *ranked(judged)[:top]]
        if record.parity is None
    ]


def reserved_s(
    spec: SearchSpec,
    records: Sequence[TrialRecord],
    state: ParityState | None,
    steps: int,
    top: int,
    objective: Objective,
) -> float:
    """Seconds the parity runs a check would make now are expected to take, every
    verdict taken to pass: one run for each finalist arithmetic without a verdict and,
    with any, the reference and its twin where not run yet (the twin always counted,
    though it runs only where a verdict depends on it). A run takes what its quickest
    alike measured config would take for `steps` steps (`run_s`), plus the held-out
    evaluations (`evaluation_s`). A config or arithmetic not measured yet is timed as the
    slowest that was. 0 while nothing that fits was."""
    quickest: dict[Arithmetic, TrialResult] = {}
    fits = fitting(records, spec.fit_limit_bytes)
    for r in fits:
        key = Arithmetic.of(r.candidate)
        if key not in quickest or run_s(r.result, steps, 1) < run_s(quickest[key], steps, 1):
            quickest[key] = r.result
    if not quickest:
        return 0.0
    slowest = max(quickest.values(), key=lambda r: run_s(r, steps, 1))
    wanted = ParityState(reference_candidate(spec, records), steps, learning_rate(spec), spec.seed)
    state = stored.retrying() if (stored := state) and stored.same_setup(wanted) else wanted
    pending = unjudged(spec, state, records, max(1, top), objective)
    finalists = list(dict.fromkeys(Arithmetic.of(c) for c in pending))
    if not finalists:  # every finalist keeps the recipe's arithmetic, or has its verdict
        return 0.0
    reference = Arithmetic.of(state.reference)
    runs = [quickest.get(a, slowest) for a in finalists]
    if "reference" not in state.curves:
        runs.append(quickest.get(reference, slowest))
    twin = twin_of(spec, state.reference)
    if "twin" not in state.curves and twin is not None:
        measured = [r.result for r in fits if r.candidate == twin]
        runs.append(measured[0] if measured else slowest)
    evaluations = evaluation_s(spec, steps, quickest.get(reference, slowest))
    return sum(run_s(r, steps, spec.processes) + evaluations for r in runs)


def evaluation_s(spec: SearchSpec, steps: int, reference: TrialResult) -> float:
    """The held-out evaluations of a parity run of `steps` steps: forward passes in fp32,
    each a third of a training step's work on `EVAL_SAMPLES` samples, timed at the
    reference's measured step."""
    every = max(1, steps // POINTS)
    evaluations = 1 + steps // every + (1 if steps % every else 0)
    share = min(1.0, EVAL_SAMPLES / max(1, spec.space.global_batch_size)) / 3
    return evaluations * share * (reference.step_time_median_s or 0.0)


def run_s(result: TrialResult, steps: int, processes: int) -> float:
    """A run of `steps` optimizer steps of a measured config, in one process doing the
    work of `processes` (a parity run): the child's start (fork, model build), the
    one-time cost of its first steps, and the steps at the measured median."""
    start = max(0.0, result.phases_s.get("total", 0.0) - result.phases_s.get("train", 0.0))
    step = (result.step_time_median_s or 0.0) * processes
    return start + (result.one_time_s or 0.0) + steps * step


def parity_stop(
    spec: SearchSpec,
    records: Sequence[TrialRecord],
    state: ParityState | None,
    steps: int,
    top: int,
    objective: Objective,
    left: float | None,
) -> str:
    """Why exploring stops to leave the finalists' parity runs their expected time within
    the time budget ('' to go on; `left`: seconds left to explore, None: no budget; `top`:
    the finalists confirmed after them, 0 for none)."""
    if left is None or left > (reserve := reserved_s(spec, records, state, steps, top, objective)):
        return ""
    and_confirmation = " and confirmation" if top else ""
    return (
        f"time budget spent: the rest is for the parity runs (about "
        f"{format_duration(reserve)}, {steps} steps each){and_confirmation}"
    )


def quickest_alike(
    candidate: Candidate, records: Sequence[TrialRecord], fit_limit_bytes: int, steps: int
) -> Candidate:
    """What the parity run of this candidate's arithmetic (or the reference's) trains: of
    the measured configs that fit and share it, the one that would finish `steps` steps
    first, one-time cost included. A verdict holds for the arithmetic (the batch split,
    checkpointing and kernels only round differently, which the twin calibrates), so a
    compiled finalist is judged without paying its compilation again, and the recipe's
    plain fp32 AdamW reference trains as fused AdamW where that was measured quicker."""
    arithmetic = Arithmetic.of(candidate)
    timed = [
        (seconds, r.candidate)
        for r in fitting(records, fit_limit_bytes)
        if Arithmetic.of(r.candidate) == arithmetic
        and (seconds := r.result.time_to_finish_s(steps)) is not None
    ]
    return min(timed, key=lambda pair: pair[0], default=(0.0, candidate))[1]


def baseline(
    spec: SearchSpec, records: Sequence[TrialRecord], state: ParityState | None
) -> tuple[TrialRecord | None, str]:
    """What the headline compares the export with, and its name: the user's recipe as
    autotune ran it, where they gave one (--base-args, or their factory's arguments) and
    it was measured within the budget; else the plain default, named as such."""
    if spec.recipe.given:
        recipe = reference_for(spec, records, state)
        measured = [r for r in fitting(records, spec.fit_limit_bytes) if r.candidate == recipe]
        if measured:
            return measured[0], "your recipe"
    return plain_default(records, spec), "the plain default"


def reference_for(
    spec: SearchSpec, records: Sequence[TrialRecord], state: ParityState | None
) -> Candidate:
    """The reference the study's parity runs used, or the one they would use."""
    return state.reference if state else reference_candidate(spec, records)
