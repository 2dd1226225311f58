#!/usr/bin/env python
"""Recorded step times for the adaptive-measurement tests (issue #15).

Every config of two small spaces probed with a long fixed window (1 warm-up step, 14
timed), so the tests (tests/core/test_schedule.py) can replay warm-up and early stopping
on real series instead of invented ones. Its record, benchmarks/step_series.json, holds
per model each config's step durations from the second step on (the first step has no
mark before it), in the order they were probed.

    python benchmarks/step_series.py --record    # about 12 minutes on 2 cores, alone
    python benchmarks/step_series.py --quick     # 2 configs a model, 4 timed steps
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness import Benchmark, Figures, header, run, search, table

MODELS = {
    "t5-small": [
        *("--global-batch-size", "16", "--seq-len", "32", "--target-len", "8"),
        *("--optimizers", "adamw_torch,adafactor"),
    ],
    "gpt2": [
        *("--global-batch-size", "8", "--seq-len", "64"),
        *("--optimizers", "adamw_torch,adamw_torch_fused"),
    ],
}
COMMON = [
    *("--precisions", "fp32,bf16", "--checkpointing", "on,off", "--fixed-steps"),
    *("--confirm-top", "0", "--parity", "off", "--sampler", "random", "--quiet"),
    *("--lever", "torch_compile=false", "--lever", "attn_implementation=sdpa"),
]


def series(model: str, work: Path, quick: bool) -> list[Figures]:
    """Each config's step durations, in the order the search probed them."""
    trials, timed = ("2", "4") if quick else ("16", "14")
    searched = search(
        work,
        model,
        *("--model", model, *MODELS[model], *COMMON, "--warmup-steps", "1"),
        *("--max-trials", trials, "--measure-steps", timed),
    )
    ok = sorted((t for t in searched.trials if t["outcome"] == "ok"), key=lambda t: t["trial"])
    results = [work / "studies" / model / "trials" / str(t["trial"]) / "result.json" for t in ok]
    return [
        {"config": t["config"], "durations": json.loads(r.read_text())["step_times_s"]}
        for t, r in zip(ok, results, strict=True)
    ]


def measure(args: argparse.Namespace, work: Path) -> Figures:
    return {"models": {model: series(model, work, args.quick) for model in MODELS}}


def report(f: Figures) -> str:
    rows = [(model, len(configs)) for model, configs in f["models"].items()]
    return (
        header(f, "Step times recorded for the adaptive-measurement tests")
        + "\n"
        + table(("model", "configs recorded"), rows)
    )


if __name__ == "__main__":
    run(Benchmark("step_series", __doc__, measure, report))
