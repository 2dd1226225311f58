"""Parity in the parent: after confirmation, before selection.

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
from typing import TYPE_CHECKING

from autotune.core.enums import Precision
from autotune.core.parity import Arithmetic, Curve, ParityState, judge, tolerance
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialRecord, TrialResult
from autotune.probe import device
from autotune.search.selection import fitting, ranked

if TYPE_CHECKING:
    from autotune.search.run import SearchRun

PARITY_LR = 1e-3  # without a learning_rate in --base-args: the loss falls within K steps
DEFAULT_STEPS = 30


def reference_candidate(spec: SearchSpec, records: Sequence[TrialRecord]) -> Candidate:
    """The user's recipe: their precision, optimizer and checkpointing from --base-args,
    else fp32 `adamw_torch` without checkpointing; their micro-batch, else the largest
    that ran within the budget with that recipe (any micro-batch fits the arithmetic)."""
    settings = spec.recipe_settings
    precision = Precision.FP32
    for flag, value in (("bf16", Precision.BF16), ("fp16", Precision.FP16),
                        ("tf32", Precision.TF32)):  # fmt: skip
        if settings.get(flag) is True:
            precision = value
            break
    optim = str(settings.get("optim", "adamw_torch"))
    ckpt = bool(settings.get(spec.checkpointing_field, False))
    micro = settings.get("per_device_train_batch_size")
    if not isinstance(micro, int) or spec.global_batch_size % micro:
        fits = fitting(records, spec.fit_limit_bytes)
        same = [r for r in fits if Arithmetic.of(r.candidate) == Arithmetic(precision, optim)]
        pool = same or [r for r in fits if r.candidate.precision == precision] or fits
        micro = max((r.candidate.per_device_train_batch_size for r in pool),
                    default=min(spec.space.micro_batches))  # fmt: skip
        if not pool:  # nothing measured fits: the smallest micro-batch, checkpointed
            ckpt = ckpt or True in spec.space.checkpointing
    return _single_process(spec, micro, precision, ckpt, optim)


def twin_of(spec: SearchSpec, reference: Candidate) -> Candidate | None:
    """The reference under another batch split (what rounding alone does), or None."""
    micro = reference.per_device_train_batch_size
    for other in (micro // 2, micro * 2):
        if other >= 1 and other != micro and spec.global_batch_size % other == 0:
            accumulation = spec.global_batch_size // other
            return dataclasses.replace(reference, per_device_train_batch_size=other,
                                       gradient_accumulation_steps=accumulation)  # fmt: skip
    return None


def _single_process(
    spec: SearchSpec, micro: int, precision: Precision, ckpt: bool, optim: str
) -> Candidate:
    """Parity runs are one process: the global batch is micro-batch x accumulation."""
    return Candidate(micro, spec.global_batch_size // micro, precision, ckpt, optim)


def learning_rate(spec: SearchSpec) -> float:
    value = spec.base_arguments.get("learning_rate")
    return float(value) if isinstance(value, (int, float)) and value > 0 else PARITY_LR


class ParityCheck:
    """Runs what the finalists' verdicts need and stores them (`run`: the SearchRun whose
    launcher and folders the runs use)."""

    def __init__(self, run: SearchRun, steps: int, top: int) -> None:
        self.run = run
        self.store = run.store
        self.spec = run.spec
        self.steps = steps
        self.top = max(1, top)

    def settle(self) -> ParityState | None:
        """Check the finalists' arithmetics until none of the top is left unjudged."""
        records = self.store.records()
        reference = reference_candidate(self.spec, records)
        rate = learning_rate(self.spec)
        state = self.store.parity()
        if state is None or not state.same_setup(reference, self.steps, rate):
            state = ParityState(reference, self.steps, rate)
        for _ in range(len(self.spec.space.precisions) * len(self.spec.space.optimizers) + 1):
            todo = self._unjudged(state, self.store.records())
            if todo is None:
                break
            state = self._judge(state, todo)
            self.store.save_parity(state)
        return state

    def _unjudged(self, state: ParityState, records: Sequence[TrialRecord]) -> Candidate | None:
        """The best-ranked finalist whose arithmetic has no verdict yet."""
        pool = [r for r in fitting(records, self.spec.fit_limit_bytes)
                if not (r.parity and r.parity.blocks_export)]  # fmt: skip
        for record in ranked(pool)[: self.top]:
            if state.verdict(record.candidate) is None:
                return record.candidate
        return None

    def _judge(self, state: ParityState, candidate: Candidate) -> ParityState:
        curves = dict(state.curves)
        if "reference" not in curves:
            curves["reference"] = self._curve("reference", state.reference)
            twin = twin_of(self.spec, state.reference)
            if twin is not None:
                curves["twin"] = self._curve("twin", twin)
        tol = tolerance(curves["reference"], curves.get("twin"))
        key = Arithmetic.of(candidate).key
        single = _single_process(self.spec, candidate.per_device_train_batch_size,
                                 candidate.precision, candidate.activation_checkpointing,
                                 candidate.optim)  # fmt: skip
        curves[key] = self._curve(key.replace("|", "-"), single)
        verdict = judge(curves["reference"], curves[key], tol)
        self.run.observer.on_parity(candidate, verdict)
        return dataclasses.replace(state, curves=curves, tolerance=tol,
                                   verdicts={**state.verdicts, key: verdict})  # fmt: skip

    def _curve(self, label: str, candidate: Candidate) -> Curve:
        run = self.run
        folder = f"parity-{label}-{time.strftime('%Y%m%d-%H%M%S')}"
        config = run.trial_config(-1, candidate, folder, concurrent=1)
        torch_device, visible = device.placement(self.spec.device, 1)
        args = {**config.training_arguments, "learning_rate": learning_rate(self.spec)}
        config = dataclasses.replace(
            config, parity_steps=self.steps, nproc_per_node=1, device=torch_device,
            visible_devices=visible, training_arguments=args,
        )  # fmt: skip
        probe_steps = self.spec.warmup_steps + self.spec.measure_steps
        timeout = run.limits.trial_timeout_s * max(1.0, self.steps / probe_steps)
        run.observer.on_parity_start(label, candidate)
        result: TrialResult = run.launcher.run(config, timeout_s=timeout)
        return Curve.of(result, self.steps)


def reference_for(
    spec: SearchSpec, records: Sequence[TrialRecord], state: ParityState | None
) -> Candidate:
    """The reference the study's parity runs used, or the one they would use."""
    return state.reference if state else reference_candidate(spec, records)
