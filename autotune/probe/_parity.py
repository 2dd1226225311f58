"""A parity run in the child: K optimizer steps of the candidate's training on learnable
data (or the user's, in a fixed order), with the loss on fixed held-out batches recorded
along the way (core/parity.py judges the curves).

The held-out loss is computed the same way in every run, whatever the batch split,
precision or optimizer: the same samples, in eval mode, forward in fp32 outside any
autocast, in micro-batches of a fixed size. The training loss the Trainer logs is not
used: it scales with the accumulation steps.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Subset
from transformers import TrainerCallback

from autotune.core.enums import Outcome, Task
from autotune.core.parity import EVAL_SAMPLES, POINTS
from autotune.core.trial import TrialResult
from autotune.probe._inputs import Site, TheirData, Workload
from autotune.probe._train import plain_trainer, probe_only_arguments
from autotune.probe.data import RealBatches, WorstCaseDataset
from autotune.probe.job import factory_trainer
from autotune.probe.timing import StepTimer

# Deferred imports: datasets loads only when a parity run reads the user's data


class HeldOutLoss(TrainerCallback):
    """Evaluates the held-out batches at step 0 and every `every` steps; stops the run
    once the loss is not finite (nothing after a NaN can recover)."""

    def __init__(
        self, batches: list[dict[str, torch.Tensor]], every: int, last: int, shifted: bool
    ) -> None:
        self.batches = batches
        self.every = every
        self.last = last
        self.shifted = shifted  # a causal LM's labels are shifted inside the model
        self.points: list[tuple[int, float]] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.points.append((0, self.evaluate(kwargs["model"], args.device)))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        if step % self.every and step != self.last:
            return
        loss = self.evaluate(kwargs["model"], args.device)
        self.points.append((step, loss))
        if not math.isfinite(loss):
            control.should_training_stop = True

    @torch.no_grad()
    def evaluate(self, model: Any, device: torch.device) -> float:
        """The mean loss per label token (per sample for classification) over the
        held-out samples: the same figure however they are split into batches."""
        # Mixed precision: accelerate wraps model.forward in its autocast and keeps the
        # plain one as _original_forward; an outer autocast(enabled=False) would not
        # undo the inner one.
        forward = getattr(model, "_original_forward", None) or model
        training = model.training
        model.eval()
        total, count = 0.0, 0
        try:
            with _full_fp32(device):
                for batch in self.batches:
                    out = forward(**{k: v.to(device) for k, v in batch.items()})
                    weight = _label_count(batch["labels"], self.shifted)
                    total += float(out.loss.float()) * weight
                    count += weight
        finally:
            model.train(training)
        return total / max(1, count)


def _label_count(labels: torch.Tensor, shifted: bool) -> int:
    """How many targets a batch's mean loss averages over (a causal LM predicts each
    token from the previous ones: its first label has no loss)."""
    if labels.dim() == 1:  # classification: one per sample
        return int(labels.numel())
    counted = labels[:, 1:] if shifted else labels
    return int((counted != -100).sum())


@contextlib.contextmanager
def _full_fp32(device: torch.device) -> Iterator[None]:
    """No autocast and, on CUDA, no TF32 matmuls (a tf32 run enables them globally)."""
    with torch.autocast(device_type=device.type, enabled=False):
        if device.type != "cuda":
            yield
            return
        matmul = torch.backends.cuda.matmul
        before = matmul.fp32_precision
        matmul.fp32_precision = "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = before


def parity_run(work: Workload, steps: int, data: TheirData, site: Site, model: Any) -> TrialResult:
    """`steps` optimizer steps on learnable data (`data`'s, where given), the held-out
    loss recorded along the way."""
    timer = StepTimer(device_kind=site.kind, warmup_steps=0)  # loss-scale skips
    fields = {**work.recipe, **_arguments(work, site.trial_dir, steps)}
    needed = steps * work.global_batch_size
    if work.model.trainer:  # the user's job: their data in one fixed order
        trainer = factory_trainer(work.model, work.seed, fields, [timer])
        trainer.train_dataset, held = split_held_out(trainer.train_dataset, needed)
        model = trainer.model
        # batched by their collator, with the columns their Trainer keeps
        eval_batches = [_forward_inputs(b, model) for b in trainer.get_eval_dataloader(held)]
    else:
        train, held, collator = _data(work, data, needed)
        size = min(8, work.candidate.per_device_train_batch_size)  # never above training's
        eval_batches = [
            collator([held[i] for i in range(start, min(start + size, len(held)))])
            for start in range(0, len(held), size)
        ]
        trainer = plain_trainer(fields, model, train, collator, [timer])
    curve = HeldOutLoss(
        eval_batches,
        every=max(1, steps // POINTS),
        last=steps,
        shifted=work.model.task == Task.CAUSAL_LM,
    )
    trainer.add_callback(curve)
    timer.attach(trainer)
    trainer.train()
    final = curve.points[-1][1]
    finite = all(math.isfinite(loss) for _, loss in curve.points)
    return TrialResult(
        outcome=Outcome.OK if finite else Outcome.UNSTABLE,
        reason="" if finite else "the held-out loss became NaN/inf",
        final_loss=final,
        loss_finite=finite,
        # every step the loss scaler skipped, its initial calibration included
        skipped_steps=timer.skipped_in_window + timer.skipped_in_warmup + timer.calibration_steps,
        curve=tuple((s, round(v, 6) if math.isfinite(v) else v) for s, v in curve.points),
    )


def split_held_out(data: Any, needed: int) -> tuple[Any, Any]:
    """(the first `needed` samples, trained on in one fixed order; the last EVAL_SAMPLES,
    held out and never trained on). With too little data to hold any out, the first
    samples are held out and also trained on."""
    count = len(data)
    if count > 2 * EVAL_SAMPLES:
        held = _subset(data, range(count - EVAL_SAMPLES, count))
        return _subset(data, range(min(needed, count - EVAL_SAMPLES))), held
    return data, _subset(data, range(min(EVAL_SAMPLES, count)))


def _subset(data: Any, indices: range) -> Any:
    if hasattr(data, "select"):  # a datasets.Dataset keeps its columns (and their removal)
        return data.select(indices)

    return Subset(data, indices)


def _forward_inputs(batch: dict[str, Any], model: Any) -> dict[str, torch.Tensor]:
    """The batch's tensors the model's forward names (a collator may add its own keys)."""

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(inspect.signature(base.forward).parameters)
    return {k: v.cpu() for k, v in batch.items() if k in names and isinstance(v, torch.Tensor)}


def _data(work: Workload, data: TheirData, needed: int) -> tuple[Any, Any, Any]:
    """The training samples (steps x global batch, one fixed order) and the held-out ones:
    the user's tokenized data where given, else worst-case samples."""

    if data.path:
        from datasets import load_from_disk

        train, held = split_held_out(load_from_disk(data.path), needed)
        collator = RealBatches(task=work.model.task, pad_token_id=data.pad_token_id)
        return train, held, collator

    held = WorstCaseDataset.of(work, EVAL_SAMPLES, offset=10_000_000)
    return WorstCaseDataset.of(work, needed), held, _stack


def _stack(features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([f[key] for f in features]) for key in features[0]}


def _arguments(work: Workload, trial_dir: str, steps: int) -> dict[str, Any]:
    """A probe's bookkeeping fields, no logging, and one batch order for every config."""

    return {
        **probe_only_arguments(work.recipe, work.seed, trial_dir, steps),
        "logging_strategy": "no",
        "data_seed": work.seed,
        "train_sampling_strategy": "random",
    }
