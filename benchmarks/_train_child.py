"""A real training run in its own process, under RLIMIT_DATA: what a user's script does.

    python benchmarks/_train_child.py SPEC.json OUT.json

SPEC: {"model": config dict, "task": ..., "seq_len", "target_len", "budget_bytes",
"args": TrainingArguments fields, "num_samples"}. OUT: outcome, steady samples/s (steps
after the first two), time to the first completed step, peak RSS, the batch in use.
Not part of autotune: the benchmarks' stand-in for "the user's own training".
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

spec = json.loads(Path(sys.argv[1]).read_text())
resource.setrlimit(resource.RLIMIT_DATA, (spec["budget_bytes"], spec["budget_bytes"]))
started = time.perf_counter()

from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from autotune.core.outcomes import is_out_of_memory  # noqa: E402
from autotune.core.trial import ModelSpec  # noqa: E402
from autotune.hf.models import build_model  # noqa: E402
from autotune.probe.data import WorstCaseDataset  # noqa: E402


class Steps(TrainerCallback):
    def __init__(self) -> None:
        self.ends: list[float] = []
        self.batch = 0

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.ends.append(time.perf_counter())

    def on_train_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.ends.clear()  # auto_find_batch_size restarts training after an OOM


out: dict[str, object] = {}
steps = Steps()
try:
    model = build_model(ModelSpec("bench", "local", spec["task"], spec["model"]))
    args = TrainingArguments(**spec["args"])
    data = WorstCaseDataset(
        task=spec["task"],
        length=spec["num_samples"],
        seq_len=spec["seq_len"],
        target_len=spec["target_len"],
        vocab_size=spec["model"]["vocab_size"],
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[steps])
    trainer.train()
    per_device = int(getattr(trainer, "_train_batch_size", args.per_device_train_batch_size))
    samples_per_step = per_device * args.gradient_accumulation_steps
    intervals = [b - a for a, b in zip(steps.ends[1:], steps.ends[2:], strict=False)]
    out = {
        "outcome": "ok",
        "per_device_train_batch_size": per_device,
        "samples_per_step": samples_per_step,
        "steady_samples_per_s": (
            samples_per_step * len(intervals) / sum(intervals) if intervals else None
        ),
        "steps": len(steps.ends),
    }
except BaseException as exc:  # classify like the probe does
    oom = is_out_of_memory(exc, limit_bytes=spec["budget_bytes"], in_use_bytes=None)
    out = {"outcome": "oom" if oom else "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
out["wall_s"] = time.perf_counter() - started
out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
Path(sys.argv[2]).write_text(json.dumps(out))
