#!/usr/bin/env python
"""ZeRO stages against plain DDP (#17's sharding lever), measured on this CPU.

Two-process probes, the way a search runs them (torchrun, gloo, the real Trainer under
DeepSpeed), fp32 AdamW, of two GPT-2 shapes: one where activations weigh as much as the
states, one where the states (weights, gradients, AdamW's moments) dominate. Per stage:
samples/s, the peak resident memory per process, and the static bytes per process the
estimate expects. Run it alone on the machine: the figures are throughputs.

    python benchmarks/zero_stages.py            # about 4 minutes on 2 cores
    python benchmarks/zero_stages.py --quick    # a tiny shape, DDP and ZeRO-3
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import Benchmark, Figures, gpt2, header, run, table

from autotune.core.enums import DeviceKind
from autotune.core.levers import shards
from autotune.core.trial import Candidate, ModelSpec, TrialConfig
from autotune.hf.models import count_parameters
from autotune.hf.training_args import tuned_arguments
from autotune.launch.runner import run_trial
from autotune.tuning.estimate import static_bytes

GPT2 = gpt2(n_head=8, vocab_size=32000)
SHAPES = {  # name: (config, micro-batch, tokens)
    "gpt2 512x4 (29M), batch 16x64": ({**GPT2, "n_embd": 512, "n_layer": 4}, 16, 64),
    "gpt2 1024x4 (83M), batch 2x16": ({**GPT2, "n_embd": 1024, "n_layer": 4}, 2, 16),
}
QUICK = {"gpt2 128x2, batch 2x16": (gpt2(), 2, 16)}
MiB = 2**20


def probe(work: Path, model: ModelSpec, batch: int, tokens: int, stage: int) -> Figures:
    candidate = Candidate(batch, 1, "fp32", False, "adamw_torch", zero_stage=stage)
    config = TrialConfig(
        number=stage,
        trial_dir=str(work / f"zero{stage}"),
        model=model,
        candidate=candidate,
        device="cpu",
        seq_len=tokens,
        target_len=0,
        memory_limit_bytes=None,
        warmup_steps=2,
        measure_steps=4,
        nproc_per_node=2,
        training_arguments=tuned_arguments(candidate, device_kind=DeviceKind.CPU),
    )
    result = run_trial(config, timeout_s=600)
    params = count_parameters(model).total
    return {
        "stage": stage,
        "outcome": str(result.outcome),
        "samples_per_s": result.samples_per_s,
        "peak_mib": (result.peak_memory_bytes or 0) // MiB,
        "static_estimate_mib": static_bytes(params, "fp32", "adamw_torch", shards(stage, 2)) // MiB,
        "parameters": params,
    }


def measure(args: argparse.Namespace, work: Path) -> Figures:
    rows = []
    for name, (config, batch, tokens) in (QUICK if args.quick else SHAPES).items():
        model = ModelSpec(name, "local", "causal-lm", config)
        for stage in (0, 3) if args.quick else (0, 1, 2, 3):
            rows.append(
                {"shape": name, **probe(work / str(len(rows)), model, batch, tokens, stage)}
            )
            print(rows[-1], flush=True)
    return {"rows": rows}


def report(f: Figures) -> str:
    rows = [
        (
            r["shape"],
            "0 (DDP)" if r["stage"] == 0 else r["stage"],
            f"{r['samples_per_s']:.2f}" if r["samples_per_s"] else r["outcome"],
            f"{r['peak_mib']} MiB",
            f"{r['static_estimate_mib']} MiB",
        )
        for r in f["rows"]
    ]
    columns = (
        "shape",
        "ZeRO stage",
        "samples/s",
        "peak per process",
        "estimated states per process",
    )
    return (
        header(f, "ZeRO stages against plain DDP: the sharding lever")
        + "\nEach row one two-process probe as a search runs it, fp32 AdamW, 2 warm-up + 4 "
        "timed steps. Estimated states: weights + gradients + optimizer state per process.\n\n"
        + table(columns, rows)
    )


if __name__ == "__main__":
    run(Benchmark("zero_stages", __doc__, measure, report))
