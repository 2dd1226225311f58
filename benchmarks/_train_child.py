"""A real training run in its own process, under RLIMIT_DATA: what a user's script does.

    python benchmarks/_train_child.py SPEC.json OUT.json

SPEC: {"model": config dict, "task": ..., "seq_len", "target_len", "budget_bytes",
"args": TrainingArguments fields, "num_samples"}, and optionally "eval_samples" (an
evaluation set of that many worst-case samples, for the args' eval_strategy) and
"attn_implementation", "adapter" (LoRA settings the model is wrapped in, as
`--lora` reads them) and "flops" (true: count the model's training FLOPs a sample,
`model_flops_per_sample`); a "budget_bytes" of null sets no RLIMIT_DATA. OUT: outcome,
steady samples/s (steps after the first two), peak RSS (and the GPU's peak allocated,
on CUDA), the batch in use, and where the peak grew (`Watch`). On CUDA each step's end
is taken after the GPU's queued work is done.
Not part of autotune: the benchmarks' stand-in for "the user's own training".
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

spec = json.loads(Path(sys.argv[1]).read_text())
budget = spec["budget_bytes"]
if budget is not None:
    resource.setrlimit(resource.RLIMIT_DATA, (budget, budget))
started = time.perf_counter()

import torch  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from autotune.core.outcomes import is_out_of_memory  # noqa: E402
from autotune.core.trial import ModelSpec  # noqa: E402
from autotune.hf.models import build_model  # noqa: E402
from autotune.probe.data import WorstCaseDataset  # noqa: E402
from autotune.probe.flops import flops_per_sample  # noqa: E402

CUDA = not spec["args"].get("use_cpu", False) and torch.cuda.is_available()


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def data_segment() -> int:
    """VmData now: what RLIMIT_DATA counts (a sample; the kernel keeps no peak of it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    return 0


class Watch(TrainerCallback):
    """When each optimizer step ended, and where the peak resident set grew: its growth
    since the previous callback is credited to the event that just ended (the setup, a
    training step before the first evaluation or after it, an evaluation, a save).
    ru_maxrss is the process's high-water mark, so the growth between two callbacks is
    exactly what happened between them."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.last = peak_rss()
        # the imports' peak, then what each kind of event added: they sum to the peak
        events = ("setup", "first_steps", "later_steps", "evaluations", "saves")
        self.grew = {"imports": self.last, **dict.fromkeys(events, 0)}
        self.before_evaluation: int | None = None  # the peak when the first evaluation began
        self.data_max = data_segment()  # VmData's largest sample at these callbacks

    def credit(self, event: str) -> None:
        now = peak_rss()
        self.grew[event] += now - self.last
        self.last = now
        self.data_max = max(self.data_max, data_segment())

    def on_train_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.ends.clear()  # auto_find_batch_size restarts training after an OOM
        self.credit("setup")

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if CUDA:  # the step's kernels are queued, not yet run
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())
        self.credit("first_steps" if self.before_evaluation is None else "later_steps")

    def on_evaluate(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.before_evaluation is None:
            self.before_evaluation = self.last
        self.credit("evaluations")

    def on_save(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.credit("saves")


def worst_case(length: int, offset: int = 0) -> WorstCaseDataset:
    return WorstCaseDataset(
        task=spec["task"],
        length=length,
        seq_len=spec["seq_len"],
        target_len=spec["target_len"],
        vocab_size=spec["model"]["vocab_size"],
        offset=offset,
    )


out: dict[str, object] = {}
watch = Watch()
try:
    attention = spec.get("attn_implementation")  # none: the model's default
    model = build_model(
        ModelSpec("bench", "local", spec["task"], spec["model"], spec.get("adapter") or {}),
        **({"attn_implementation": attention} if attention else {}),
    )
    if spec.get("flops"):
        out["model_flops_per_sample"] = flops_per_sample(
            model, spec["task"], spec["seq_len"], spec["target_len"]
        )
    args = TrainingArguments(**spec["args"])
    data = worst_case(spec["num_samples"])
    evaluating = spec.get("eval_samples")
    held = worst_case(evaluating, offset=spec["num_samples"]) if evaluating else None
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data,
        eval_dataset=held,  # samples disjoint from the training ones
        callbacks=[watch],
    )
    trainer.train()
    per_device = int(getattr(trainer, "_train_batch_size", args.per_device_train_batch_size))
    samples_per_step = per_device * args.gradient_accumulation_steps
    intervals = [b - a for a, b in zip(watch.ends[1:], watch.ends[2:], strict=False)]
    out |= {
        "outcome": "ok",
        "per_device_train_batch_size": per_device,
        "samples_per_step": samples_per_step,
        "steady_samples_per_s": (
            samples_per_step * len(intervals) / sum(intervals) if intervals else None
        ),
        "steps": len(watch.ends),
    }
except BaseException as exc:  # classify like the probe does
    oom = is_out_of_memory(exc, limit_bytes=budget, in_use_bytes=None)
    out |= {"outcome": "oom" if oom else "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
out["wall_s"] = time.perf_counter() - started
out["peak_rss_bytes"] = peak_rss()
if CUDA:
    out["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
out["peak_grew_bytes"] = watch.grew
out["peak_before_evaluation_bytes"] = watch.before_evaluation
out["data_segment_max_bytes"] = watch.data_max
Path(sys.argv[2]).write_text(json.dumps(out))
