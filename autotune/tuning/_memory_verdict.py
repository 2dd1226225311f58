"""The memory estimate refined by a study's probes, and its verdicts on a candidate as the
skip rules and proposals use them.

Two questions with two thresholds: whether a config is so far over the budget that
probing it would only waste an out-of-memory launch (skip it), and whether the estimate,
fitted to this study's probes, says it fits at all (propose it before those that do not;
open the smaller fallback batches of a family whose batch 8 does not).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

from autotune.core.enums import Outcome
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialRecord, TrialResult
from autotune.core.units import format_size
from autotune.tuning._user_job import narrowest
from autotune.tuning.estimate import FAR_OVER, PROCESS_BYTES, Breakdown, breakdown, floor_bytes
from autotune.tuning.selection import fitting

# An out-of-memory run's peak was above this share of the limit at least: the CPU's
# limit counts reserved data pages, a few percent above the resident set the peaks count
OOM_SLACK = 0.9
# An out-of-memory run needed more than the limit by an unknown amount: a config the
# estimate puts within this share of the limit below it (or above) is expected out of
# memory too. The families' LoRA job with memory binding: batch 8 bf16 with fused AdamW
# out of memory, the same with Adafactor (the same activations, a few KiB less state)
# was still said to fit, and probed out of memory; so was every batch-8 optimizer in turn
OOM_NEAR = 0.05


@dataclasses.dataclass(frozen=True)
class EstimateVerdicts:
    """The verdicts of the estimate refined by a study's records (skips.Verdictor)."""

    spec: SearchSpec
    predict: Callable[[Candidate], int | None]
    # what a skip (a verdict no later probe revisits) may rest on: clean runs only, not
    # the bound an out-of-memory run sets, which blames every unexplained byte on the
    # activations (an OOM set off by something the model leaves out would skip for good
    # configs of other families that fit)
    predict_for_skip: Callable[[Candidate], int | None]
    # the estimate of each config the study found out of memory, as `predict` puts it
    out_of_memory: tuple[int, ...] = ()

    def __call__(self, candidate: Candidate) -> str | None:
        """A reason when the candidate cannot fit: its weights, gradients and optimizer
        state alone exceed what a probe may use, or the estimate puts it far over."""
        spec = self.spec
        floor = floor_bytes(
            spec.parameters or 0,
            candidate,
            spec.processes,
            spec.embedding_parameters,
            spec.trainable_parameters,
            spec.frozen_bytes,
        )
        if floor > spec.fit_limit_bytes:
            return (
                f"weights, gradients and optimizer state alone take {format_size(floor)}, "
                f"over the {format_size(spec.fit_limit_bytes)} a probe may use"
            )
        peak = self.predict_for_skip(candidate)
        if peak is None or peak <= FAR_OVER * spec.memory_budget_bytes:
            return None
        budget = format_size(spec.memory_budget_bytes)
        return f"estimate {format_size(peak)} is far over the {budget} budget"

    def fits(self, candidate: Candidate) -> bool:
        """The estimate's verdict: the predicted peak within what a probe may use, and
        not within OOM_NEAR of a config found out of memory. Its activation term is the
        most optimistic fit to the study's peaks (before a clean probe, the least scale
        the OOM probes imply), so a config it says does not fit very likely does not;
        the estimate ranks configs by memory more surely than it sizes them, so one it
        ranks with a config that ran out of memory is expected to as well."""
        peak = self.predict(candidate)
        if peak is None:
            return True
        limit = self.spec.fit_limit_bytes
        near = min(self.out_of_memory, default=None)
        return peak <= limit and (near is None or peak < near - OOM_NEAR * limit)


def far_over_budget(spec: SearchSpec, recs: Sequence[TrialRecord]) -> EstimateVerdicts:
    """The verdicts with the estimate refined by the study's records so far."""
    predict, for_skip = _predictors(spec, recs)
    return EstimateVerdicts(spec, predict, for_skip, _ranked_out(spec, recs, predict))


def _ranked_out(
    spec: SearchSpec, records: Sequence[TrialRecord], predict: Callable[[Candidate], int | None]
) -> tuple[int, ...]:
    """The estimates of the configs found out of memory that the estimate ranks above
    every config measured within the limit: where a probe contradicts its ranking (an
    OOM estimated under a config that fit), the ranking says nothing near that OOM."""
    fit = [predict(r.candidate) for r in fitting(records, spec.fit_limit_bytes)]
    highest = max((p for p in fit if p is not None), default=0)
    ooms = [predict(r.candidate) for r in records if r.result.outcome == Outcome.OOM]
    return tuple(p for p in ooms if p is not None and p > highest)


Predictor = Callable[[Candidate], int | None]


def _predictors(spec: SearchSpec, records: Sequence[TrialRecord]) -> tuple[Predictor, Predictor]:
    """Predicted peak of a candidate from the analytic terms and this study's probes: with
    the out-of-memory probes' bound (before any clean probe, the activation term is the
    least they imply) and from clean runs only (left out: an optimistic estimate).

    The peak is the largest of three moments: backward, with the activations; its end,
    with the embedding's gradients, and the optimizer step, with its temporaries, both
    once the activations are freed. The two share the process term and each config's
    analytic terms (computed once a round: the skip rules and the proposals ask for
    every config of the space).
    """
    if not spec.parameters:
        return (lambda candidate: None), (lambda candidate: None)
    process = process_bytes(spec.device.kind, records)

    @functools.cache
    def terms(candidate: Candidate) -> Breakdown:
        return spec_breakdown(spec, candidate)

    measured = [(terms(r.candidate), r.result) for r in records]

    def predictor(scale: float | None) -> Predictor:
        def predict(candidate: Candidate) -> int:
            b = terms(candidate)
            peak = b.static + max((scale or 0.0) * b.activations, b.after_activations)
            return int(process + peak)

        return predict

    return (
        predictor(activation_scale(measured, process, spec.fit_limit_bytes)),
        predictor(activation_scale(measured, process)),
    )


def spec_breakdown(spec: SearchSpec, candidate: Candidate) -> Breakdown:
    """The analytic terms of a candidate of this study: its job as held, its lengths."""
    return breakdown(
        spec.parameters,
        spec.model.config,
        spec.model.task,
        candidate,
        spec.trained_len(candidate),
        spec.target_len,
        spec.processes,
        spec.embedding_parameters,
        spec.largest_parameter,
        spec.device.kind,
        spec.trainable_parameters,
        spec.frozen_bytes,
        bool(spec.job_profile.get("fused_head")),
        bool(narrowest(spec.job_profile.get("held", {}))),
    )


def process_bytes(device_kind: str, records: Sequence[TrialRecord]) -> int:
    """What a probe process holds before its first step beyond the model's tensors: the
    median its probes measured (CUDA: the context, 676 MiB on an H100 where the typical
    figure says 600; CPU: the resident set after the imports), else the typical figure;
    plus the median the job's setup held on top (the Trainer and its data, the user's
    dataset and tokenizer: probe/device.setup_bytes), which no config's terms scale."""
    key = "context_bytes" if device_kind == "cuda" else "rss_bytes"
    process = _median(records, key)
    return (PROCESS_BYTES.get(device_kind, 0) if process is None else process) + (
        _median(records, "setup_bytes") or 0
    )


def _median(records: Sequence[TrialRecord], key: str) -> int | None:
    """The median of a baseline figure over the probes that measured it."""
    seen = sorted(
        int(value)
        for r in records
        if isinstance(value := r.result.baseline.get(key), int | float) and value > 0
    )
    return seen[len(seen) // 2] if seen else None


def predicted_peak(spec: SearchSpec, candidate: Candidate, process_bytes: int) -> int | None:
    """The analytic estimate of a candidate's peak, before any probe refines it: what the
    process holds, the weights as held, gradients and state for what trains, and the
    larger of the activations and the step's temporaries. None when the job's parameters
    are unknown."""
    if not spec.parameters:
        return None
    return process_bytes + spec_breakdown(spec, candidate).total


def activation_scale(
    measured: Sequence[tuple[Breakdown, TrialResult]], process_bytes: int, limit_bytes: int = 0
) -> float | None:
    """How far the analytic activations are from this study's measured peaks.

    The smallest ratio over clean runs: the most optimistic fit, so the estimate errs
    towards "might fit" and never talks the search out of a config that would. A peak
    the optimizer step or backward's end may have set (no more above the static terms
    than their temporaries) says nothing of the activations and is left out.

    Before any clean run, out-of-memory runs bound it from below: the smallest scale
    that puts each over what it held when it failed (its recorded peak, at least
    OOM_SLACK of `limit_bytes`; where its static terms and their temporaries alone
    would not), so the first OOM already tells which configs of other
    families cannot fit either.
    """
    ratios = [
        (r.peak_memory_bytes - process_bytes - b.static) / b.activations
        for b, r in measured
        if r.outcome == Outcome.OK
        and r.peak_memory_bytes
        and b.activations > 0
        and r.peak_memory_bytes - process_bytes - b.static > b.after_activations
    ]
    if ratios:
        return max(0.0, min(ratios))
    if limit_bytes <= 0:
        return None
    held = [(b, reached) for b, r in measured if (reached := oom_reached(r, limit_bytes))]
    bounds = [
        (reached - process_bytes - b.static) / b.activations
        for b, reached in held
        if b.activations > 0 and reached - process_bytes - b.static > b.after_activations
    ]
    return max(bounds) if bounds else None


def oom_reached(result: TrialResult, limit_bytes: int) -> float | None:
    """What an out-of-memory run held at least when it failed: the peak it recorded (in
    the currency of every other peak), or OOM_SLACK of the limit if that says more. None
    for a run the allocator did not stop (no error, no peak: a SIGKILL from outside, the
    kernel's OOM killer taking the host's memory, says nothing of this probe's)."""
    if result.outcome != Outcome.OOM or not (result.error or result.peak_memory_bytes):
        return None
    return max(OOM_SLACK * limit_bytes, float(result.peak_memory_bytes or 0))
