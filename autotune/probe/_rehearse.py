"""A rehearsal in the child (core/rehearsal.py): one training step on worst-case
batches; at its end, as the user's run does at `eval_steps` and `save_steps`, one
evaluation pass over their evaluation data with their collator, `compute_metrics` and
evaluation settings (a stand-in: synthetic samples at the worst-case length), and a
checkpoint save with their save settings; then a resume from that checkpoint, one more
step, as a restarted run reads it back. Each event's start and end, with the process's
peak memory, are written to `EVENTS_NAME` as they happen: an event the process dies in
is the one started and never ended."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from autotune.core.enums import Outcome
from autotune.core.files import append_line
from autotune.core.rehearsal import EVENTS_NAME
from autotune.core.trial import TrialResult
from autotune.probe import device as hardware
from autotune.probe._inputs import Site, Workload
from autotune.probe._train import probe_only_arguments, worst_case_trainer

# Deferred imports: torch loads in the probe, once its device is chosen; the search imports the
# probe's modules through the fork server without it

EVAL_OFFSET = 10_000_000  # synthetic evaluation samples: clear of the training ones


class Events(TrainerCallback):
    """At the first step's end, asks the Trainer for the evaluation and the save its
    run makes at `eval_steps` and `save_steps` (its own strategies stay "no": a job with
    no evaluation dataset is still built), and writes each event's start and end, with
    the peak so far, as the Trainer reaches them."""

    def __init__(self, site: Site, *, evaluate: bool, save: bool) -> None:
        self.path = Path(site.trial_dir) / EVENTS_NAME
        self.kind, self.index = site.kind, site.index
        self.first = site.first
        self.evaluate, self.save = evaluate, save
        self.predicted = 0  # evaluation batches done
        self.kept_per_sample = 0  # the most bytes of logits kept for one sample so far

    def mark(self, event: str, state: str, **extra: Any) -> None:
        if not self.first:  # a DDP run: the head's first process writes the events
            return
        peak = hardware.peak_memory_bytes(self.kind, self.index)
        line = {"event": event, "state": state, "peak_bytes": peak, **extra}
        append_line(self.path, json.dumps(line))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step != 1:
            return
        self.mark("train", "end")
        control.should_evaluate, control.should_save = self.evaluate, self.save
        if self.evaluate:  # what the pass starts from: held now, not the steps' peak
            self.mark("evaluation", "start", held_bytes=hardware.footprint(self.kind, self.index))
        elif self.save:
            self.mark("save", "start")

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.predicted = 0  # a dict of evaluation sets: each its own pass
        self.mark("evaluation", "end")
        if self.save:
            self.mark("save", "start")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.mark("save", "end")

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The evaluation's progress at each tenth of its batches: an out-of-memory late
        in the pass is the kept logits piling up, not one batch's forward."""
        loader = kwargs.get("eval_dataloader")
        total = len(loader) if loader is not None and hasattr(loader, "__len__") else 0
        self.predicted += 1
        if total and self.predicted * 10 // total != (self.predicted - 1) * 10 // total:
            self.mark("evaluation", "progress", done=round(self.predicted / total, 3))

    def count_kept(self, trainer: Any, piled: bool) -> None:
        """Where the Trainer keeps the logits on the budget's device to the pass's end
        (`piled`: on the CPU, or a GPU without eval_accumulation_steps), measure what it
        keeps of each sample as it goes (through preprocess_logits_for_metrics: theirs,
        or one that keeps the logits as they are): the pass then holds that for every
        sample of their evaluation set, a floor no evaluation batch lowers."""
        if not piled or trainer.eval_dataset is None:
            return
        theirs = trainer.preprocess_logits_for_metrics
        samples = _samples(trainer.eval_dataset)

        def measured(logits: Any, labels: Any) -> Any:
            kept = theirs(logits, labels) if theirs is not None else logits
            rows = _rows(kept)
            per_sample = _bytes(kept) // rows if rows else 0
            if per_sample > self.kept_per_sample:
                self.kept_per_sample = per_sample
                self.mark("evaluation", "kept", bytes_per_sample=per_sample, samples=samples)
            return kept

        trainer.preprocess_logits_for_metrics = measured


def _bytes(kept: Any) -> int:
    """The bytes of the tensors in what the Trainer keeps of a batch (nested alike)."""
    if isinstance(kept, list | tuple):
        return sum(_bytes(k) for k in kept)
    if isinstance(kept, dict):
        return sum(_bytes(k) for k in kept.values())
    return int(kept.numel() * kept.element_size()) if hasattr(kept, "numel") else 0


def _rows(kept: Any) -> int:
    """The samples in a batch of what is kept: its first tensor's leading dimension."""
    if isinstance(kept, list | tuple):
        return next((r for k in kept if (r := _rows(k))), 0)
    if isinstance(kept, dict):
        return next((r for k in kept.values() if (r := _rows(k))), 0)
    shape: tuple[int, ...] = tuple(getattr(kept, "shape", ()))
    return int(shape[0]) if len(shape) else 0


def _samples(dataset: Any) -> int:
    """The samples of an evaluation set (of every set, where it is a dict of them)."""
    if isinstance(dataset, dict):
        return max((_samples(d) for d in dataset.values()), default=0)
    return len(dataset) if hasattr(dataset, "__len__") else 0


def rehearse(work: Workload, plan: dict[str, Any], site: Site, model: Any) -> TrialResult:
    """Rehearse the events `plan` asks for (TrialConfig.rehearsal) under the probe's limit."""
    out = Path(site.trial_dir) / "rehearsal"
    evaluate, save = bool(plan.get("evaluate")), bool(plan.get("save"))
    fields = {
        **work.recipe,
        **probe_only_arguments(work.recipe, work.seed, site.trial_dir, 1),
        **plan.get("fields", {}),
        "output_dir": str(out),
        "eval_strategy": "no",
        "save_strategy": "no",
        "load_best_model_at_end": False,
    }
    events = Events(site, evaluate=evaluate, save=save)
    try:
        trainer = worst_case_trainer(work, fields, model, [events], 2)
        if evaluate and not work.model.trainer:
            trainer.eval_dataset = _synthetic_eval(work, int(plan.get("eval_samples", 0)))
        if evaluate and trainer.eval_dataset is None:
            events.mark("evaluation", "skipped", reason="your job has no evaluation dataset")
            events.evaluate = False
        args = trainer.args
        keeps = trainer.compute_metrics is not None and not (
            args.prediction_loss_only or getattr(args, "batch_eval_metrics", False)
        )
        if site.first:
            append_line(events.path, json.dumps({"logits_kept": keeps}))
        on_device = site.kind != "cuda" or args.eval_accumulation_steps is None
        events.count_kept(trainer, keeps and evaluate and on_device)
        events.mark("train", "start")
        trainer.train()
        # the stand-in's model trains on; the user's factory builds theirs again, and the
        # first must be gone by then, as in a restarted run
        model = None if work.model.trainer else trainer.model
        del trainer
        gc.collect()
        if save and "deepspeed" in fields:  # one process cannot start a second engine
            events.mark("resume", "skipped", reason="not rehearsed under DeepSpeed")
        elif save and fields.get("fsdp") and model is not None:  # sharded once already
            events.mark("resume", "skipped", reason="not rehearsed under FSDP for a stand-in")
        elif save:
            _resume(work, events, fields, model, out / "checkpoint-1")
        return TrialResult(Outcome.OK, reason="rehearsed")
    finally:  # a checkpoint holds the weights and the optimizer state: not the study's
        shutil.rmtree(out, ignore_errors=True)


def _resume(
    work: Workload, events: Events, fields: dict[str, Any], model: Any, checkpoint: Path
) -> None:
    """A new Trainer (the user's factory builds their model again) reads the checkpoint
    back, optimizer state included, and trains one more step."""
    events.mark("resume", "start")
    trainer = worst_case_trainer(work, {**fields, "max_steps": 2}, model, [], 2)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    del trainer
    events.mark("resume", "end")


def _synthetic_eval(work: Workload, samples: int) -> Any:
    from autotune.probe.data import WorstCaseDataset

    return WorstCaseDataset.of(work, max(1, samples), offset=EVAL_OFFSET)
