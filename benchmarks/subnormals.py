#!/usr/bin/env python
"""Does a random-weight stand-in's fp32 training slow down on subnormal numbers on this
CPU, and more as it trains?

mt5-small built from its preset with random weights (an LM head of std 1: logits of std
24), trained with fp32 AdamW on random tokens, each step timed, in two fresh processes:
as a script runs it, and with `torch.set_flush_denormal(True)` (subnormal inputs and
results flushed to zero). At the first and last step: the share of the softmax over the
vocabulary that is subnormal, and the subnormal entries of Adam's state, with their
share beside the share a probe reads from a sample of each tensor (in the flushed run
none can be counted: it reads them as zero). Whether the two runs' losses are the
same: flushing values under 1.2e-38 should not move them. First, `autotune doctor`'s
check: an fp32 matmul of subnormal inputs against normal ones. Last, a search's real
probe of the same stand-in and batch (fp32 AdamW, a warm-up step and three timed): the
share it reads, the CPU's cost it times, what the reading took, and whether the export
would tell the user to flush them.

    python benchmarks/subnormals.py --record    # 20 steps a run: 7-8 minutes on 2 cores
    python benchmarks/subnormals.py --quick     # 3 steps a run, t5-small
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from pathlib import Path
from typing import Any

from harness import Benchmark, Figures, header, run, table

from autotune.core.trial import Candidate, TrialConfig
from autotune.hf.models import resolve_model
from autotune.launch.runner import run_trial
from autotune.probe import subnormals
from autotune.views.export import flush_lines

BATCH, SOURCE, TARGET = 8, 64, 16


def train(model_name: str, steps: int, flush: bool) -> Figures:
    """One run in this (fresh) process: each step's seconds and loss, and the
    subnormals at the first and last step."""
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    from autotune.hf.models import resolve_model

    torch.set_flush_denormal(flush)
    torch.manual_seed(0)
    values = dict(resolve_model(model_name).config)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    model = AutoModelForSeq2SeqLM.from_config(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    tiny = torch.finfo(torch.float32).tiny

    def subnormal(t: Any) -> int:
        a = t.detach().abs()
        return int(((a > 0) & (a < tiny)).sum())

    tokens = torch.Generator().manual_seed(1)
    seconds, losses, seen = [], [], {}
    for step in range(steps):
        ids = torch.randint(0, config.vocab_size, (BATCH, SOURCE), generator=tokens)
        labels = torch.randint(0, config.vocab_size, (BATCH, TARGET), generator=tokens)
        started = time.perf_counter()
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(round(time.perf_counter() - started, 2))
        losses.append(round(out.loss.item(), 3))
        if step in (0, steps - 1) and not flush:
            with torch.no_grad():
                softmax = torch.softmax(out.logits.detach(), -1)
                state = optimizer.state.values()
                moments = [s[k] for s in state for k in ("exp_avg", "exp_avg_sq")]
                seen[f"step {step + 1}"] = {
                    "softmax_subnormal": round(subnormal(softmax) / softmax.numel(), 4),
                    "adam_state_subnormal": sum(subnormal(m) for m in moments),
                    "adam_state_numbers": sum(m.numel() for m in moments),
                    # what a probe reads: a sample of each tensor (probe/subnormals.py)
                    "probe_share": round(subnormals.share(moments) or 0.0, 4),
                }
    return {"flush": flush, "step_s": seconds, "losses": losses, "subnormals": seen}


def measure(args: argparse.Namespace, work: Path) -> Figures:
    model, steps = ("t5-small", 3) if args.quick else ("google/mt5-small", 20)
    slowdown = subnormals.slowdown()
    spawn = multiprocessing.get_context("spawn")
    runs = []
    for flush in (False, True):
        with spawn.Pool(1) as pool:
            runs.append(pool.apply(train, (model, steps, flush)))
    return {
        "model": model,
        "steps": steps,
        "batch": [BATCH, SOURCE, TARGET],
        "matmul_slowdown": [round(x, 1) for x in slowdown],
        "runs": runs,
        "probe": probe(model, work),
    }


def probe(model: str, work: Path) -> Figures:
    """A search's probe of the stand-in: what it reads of subnormal numbers, and says."""
    config = TrialConfig(
        number=0,
        trial_dir=str(work / "probe"),
        model=resolve_model(model),
        candidate=Candidate(BATCH, 1, "fp32", False, "adamw_torch"),
        device="cpu",
        seq_len=SOURCE,
        target_len=TARGET,
        memory_limit_bytes=None,
        warmup_steps=1,
        measure_steps=3,
    )
    result = run_trial(config, timeout_s=900)
    return {
        "outcome": result.outcome.value,
        "step_time_median_s": result.step_time_median_s,
        "subnormal_share": result.subnormal_share,
        "subnormal_slowdown": result.subnormal_slowdown,
        "read_s": result.phases_s.get("subnormals"),
        "export_says": flush_lines(result, stand_in=True),
    }


def report(f: Figures) -> str:
    rows = []
    for r in f["runs"]:
        s = r["step_s"]
        counts = ("not countable: read as zero",) * 3
        if r["subnormals"]:
            first, last = r["subnormals"].values()
            counts = (
                f"{first['softmax_subnormal']:.1%} -> {last['softmax_subnormal']:.1%}",
                f"{first['adam_state_subnormal']:,} -> {last['adam_state_subnormal']:,}",
                " -> ".join(
                    f"{s['adam_state_subnormal'] / s['adam_state_numbers']:.1%} "
                    f"({s['probe_share']:.1%})"
                    for s in (first, last)
                ),
            )
        rows.append(
            (
                "flushed" if r["flush"] else "as a script runs",
                f"{statistics.median(s[1:4] or s):.2f}",
                f"{statistics.median(s[-3:]):.2f}",
                *counts,
            )
        )
    median, low, high = f["matmul_slowdown"]
    same = f["runs"][0]["losses"] == f["runs"][1]["losses"]
    return (
        header(f, "What subnormal numbers cost a random-weight stand-in's fp32 steps")
        + f"\n{f['model']}, {f['batch'][0]} x {f['batch'][1]}/{f['batch'][2]} tokens, "
        + f"fp32 AdamW, {f['steps']} steps a run. Seconds a step: the median of steps 2-4, "
        + "then of the last three. An fp32 256x256 matmul of subnormal inputs took "
        + f"{median}x as long as of normal ones ({low}-{high}x: `autotune doctor`'s check).\n\n"
        + table(
            (
                "run",
                "steps 2-4",
                "last 3",
                "softmax subnormal",
                "Adam state subnormal",
                "its share (as a probe reads it)",
            ),
            rows,
        )
        + f"\nThe two runs' losses {'are identical' if same else 'differ'} at every step.\n"
        + probed(f["probe"])
    )


def probed(p: Figures) -> str:
    if p["outcome"] != "ok":
        return f"\nThe search's probe of it: {p['outcome']}.\n"
    share, slow = p["subnormal_share"], p["subnormal_slowdown"]
    read = f"{share:.1%} of its optimizer's state subnormal" if share is not None else "no state"
    timed = f", the CPU's matmul on them {slow:.0f}x as long" if slow else ", the CPU not timed"
    said = (
        f"the export says: {p['export_says'][0]}" if p["export_says"] else "the export says nothing"
    )
    return (
        f"\nThe search's probe of it ({p['step_time_median_s']:.2f} s a step): {read}{timed}, "
        f"read in {p['read_s']:.2f} s; {said}\n"
    )


if __name__ == "__main__":
    run(Benchmark("subnormals", __doc__, measure, report))
