#!/usr/bin/env python
"""Where a CUDA training peak of mT5-small goes: allocated against reserved, backward
against the optimizer step, step by step (needs a GPU).

Each config runs 3 Trainer steps in a fresh process (global batch 16, 64/16 tokens, sdpa)
that reads the allocator's figures at each step's edges; then `autotune estimate` of the
same job, for comparison. Recorded by hand before this harness:
benchmarks/gpu/h100_mt5-small_where_the_peak_goes.txt.

    python benchmarks/gpu/peak_breakdown.py --configs 1   # five configs, default and expandable allocator
    python benchmarks/gpu/peak_breakdown.py --configs 2   # fp32 AdamW, every batch split, ckpt off/on
    python benchmarks/gpu/peak_breakdown.py --quick       # 8x2 fp32 AdamW alone
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness, one level up

from harness import Benchmark, Figures, autotune, header, run, table

GLOBAL_BATCH, SEQ_LEN, TARGET_LEN, STEPS = 16, 64, 16, 3
G = 2**30
Config = tuple[int, str, str, bool]  # micro-batch, precision, optimizer, checkpointed
CONFIGS: dict[str, list[Config]] = {
    "1": [
        (8, "fp32", "adamw_torch", False),
        (16, "fp32", "adamw_torch", False),
        (8, "fp32", "adafactor", False),
        (8, "bf16", "adamw_torch", False),
        (8, "fp32", "adamw_torch_fused", False),
    ],
    "2": [(b, "fp32", "adamw_torch", ck) for ck in (False, True) for b in (16, 8, 4, 2, 1)],
}
ALLOCATORS = {"1": ("", "expandable_segments:True"), "2": ("",)}  # PYTORCH_CUDA_ALLOC_CONF


def peaks(config: Config, alloc: str) -> Figures:
    """In a fresh process: 3 Trainer steps of `config`, the allocator read at each edge."""
    if alloc:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = alloc
    import torch
    from transformers import AutoModelForSeq2SeqLM, Trainer, TrainerCallback, TrainingArguments

    from autotune.hf.models import resolve_model, transformers_config

    batch, precision, optim, checkpointed = config
    model_config = transformers_config(resolve_model("google/mt5-small").config)
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(model_config, attn_implementation="sdpa")
    rec: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters())}

    def read(**figures: Any) -> None:
        torch.cuda.synchronize()
        for name, how in figures.items():
            rec.setdefault(name, []).append(how())

    def sample(i: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(i)
        return {
            "input_ids": torch.randint(1, model_config.vocab_size, (SEQ_LEN,), generator=g),
            "attention_mask": torch.ones(SEQ_LEN, dtype=torch.long),
            "labels": torch.randint(1, model_config.vocab_size, (TARGET_LEN,), generator=g),
        }

    class Edges(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            read(start_alloc=torch.cuda.memory_allocated)
            torch.cuda.reset_peak_memory_stats()

        def on_pre_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            read(
                fwd_bwd_peak_alloc=torch.cuda.max_memory_allocated,
                fwd_bwd_peak_reserved=torch.cuda.max_memory_reserved,
                pre_step_alloc=torch.cuda.memory_allocated,
            )
            torch.cuda.reset_peak_memory_stats()

        def on_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            read(
                step_peak_alloc=torch.cuda.max_memory_allocated,
                step_peak_reserved=torch.cuda.max_memory_reserved,
            )

    fields = TrainingArguments.__dataclass_fields__  # the name changed in transformers 5
    ckpt = (
        "activation_checkpointing"
        if "activation_checkpointing" in fields
        else "gradient_checkpointing"
    )
    args = TrainingArguments(
        output_dir="/tmp/peak_breakdown",
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=GLOBAL_BATCH // batch,
        max_steps=STEPS,
        bf16=precision == "bf16",
        optim=optim,
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
        dataloader_num_workers=0,
        **{ckpt: checkpointed},
    )
    Trainer(
        model=model,
        args=args,
        train_dataset=[sample(i) for i in range(GLOBAL_BATCH * STEPS)],
        callbacks=[Edges()],
    ).train()
    stats = torch.cuda.memory_stats()
    kept = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "segment.all.peak")
    kept += ("inactive_split_bytes.all.peak", "num_alloc_retries")
    rec.update({name: stats.get(name) for name in kept})
    rec.update(
        final_alloc=torch.cuda.memory_allocated(), final_reserved=torch.cuda.memory_reserved()
    )
    return rec


def measure(args: argparse.Namespace, work: Path) -> Figures:
    configs = CONFIGS["1"][:1] if args.quick else CONFIGS[args.configs]
    runs = {}
    for alloc in ("",) if args.quick else ALLOCATORS[args.configs]:
        for config in configs:
            batch, *rest = config
            label = (
                f"{batch}x{GLOBAL_BATCH // batch} {' '.join(map(str, rest))} {alloc or 'default'}"
            )
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
                try:
                    runs[label] = fresh.submit(peaks, config, alloc).result()
                except Exception as exc:  # a config that fails is a row, not the end
                    runs[label] = {"error": f"{type(exc).__name__}: {exc}"}
            print(label, runs[label], flush=True)
    estimate = autotune(
        work,
        *("estimate", "--model", "google/mt5-small", "--device", "cuda"),
        *("--seq-len", str(SEQ_LEN), "--target-len", str(TARGET_LEN), "--batch", str(GLOBAL_BATCH)),
        *("--precisions", "fp32", "--optimizers", "adamw_torch"),
    )
    return {"runs": runs, "estimate": estimate.stdout + estimate.stderr[-800:]}


def report(f: Figures) -> str:
    def gib(r: Figures, name: str) -> str:
        return "/".join(f"{v / G:.2f}" for v in r.get(name, []))

    rows = [
        (
            label,
            gib(r, "start_alloc"),
            gib(r, "fwd_bwd_peak_alloc"),
            gib(r, "fwd_bwd_peak_reserved"),
            gib(r, "pre_step_alloc"),
            gib(r, "step_peak_alloc"),
            gib(r, "step_peak_reserved"),
            f"{(r.get('inactive_split_bytes.all.peak') or 0) / G:.2f}",
            r.get("num_alloc_retries", r.get("error", "")),
        )
        for label, r in f["runs"].items()
    ]
    params = next((r["params"] for r in f["runs"].values() if "params" in r), 0)
    columns = ("config, allocator", "start", "fwd+bwd alloc", "fwd+bwd reserved", "pre-step")
    columns += ("step alloc", "step reserved", "inactive split peak", "retries")
    return (
        header(f, "Where a CUDA peak of mT5-small goes")
        + f"\nGiB at each of {STEPS} steps; {params / 1e6:.0f}M parameters.\n\n"
        + table(columns, rows)
        + f"\n`autotune estimate` of the same job:\n\n```\n{f['estimate']}```\n"
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", choices=list(CONFIGS), default="2", help="the set of configs")


if __name__ == "__main__":
    run(Benchmark("peak_breakdown", __doc__, measure, report, options))
