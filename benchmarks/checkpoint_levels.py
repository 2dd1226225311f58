#!/usr/bin/env python
"""Graded checkpointing (#47), measured where memory binds: each level's best config
timed side by side, and the level a search picks.

For each level (off, every 4th layer, every 2nd, every layer; offloaded on CUDA) the
largest batch that fits the limit is found by probing down from the largest, then those
configs are timed in interleaved rounds (benchmarks/_truth.py: paired ratios to the
best, with 95% intervals), each with its peak. Then `autotune search` runs under the
same budget and says which config it picks: an intermediate level should win wherever
it is faster than both ends (off at the smaller batch it fits, on at the larger one).
Run it alone on the machine: the figures are throughputs.

    python benchmarks/checkpoint_levels.py                 # CPU, about 25 minutes
    python benchmarks/checkpoint_levels.py --device cuda --budget 6GiB --layers 12 \\
        --hidden 768 --seq-len 1024 --global-batch 32
    python benchmarks/checkpoint_levels.py --quick         # 2 layers, batch 1, limit auto
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _truth import measure as interleaved_rounds
from harness import (
    Benchmark,
    Figures,
    Prober,
    gpt2,
    header,
    model_folder,
    run,
    score,
    search,
    table,
)

from autotune.core.checkpointing import Checkpointing
from autotune.core.space import batch_choices
from autotune.core.trial import Candidate, ModelSpec
from autotune.core.units import parse_size

MIB = 2**20
WARMUP, MEASURE = 2, 3
Key = tuple[int, str]  # batch, checkpointing level


def model_config(args: argparse.Namespace) -> dict[str, Any]:
    # many narrow heads and long sequences: attention's activations (heads x seq^2) large
    # for its compute; logits small beside the layers (what the levels act on)
    return gpt2(
        n_embd=args.hidden,
        n_layer=args.layers,
        n_head=args.heads,
        n_positions=args.seq_len,
        vocab_size=1024,
        pad_token_id=0,
    )


def prober(args: argparse.Namespace, work: Path, limit: int | None) -> Prober:
    model = ModelSpec("bench", "local", "causal-lm", model_config(args))
    device = "cpu" if args.device == "cpu" else "cuda:0"
    work.mkdir(exist_ok=True)
    return Prober(model, work, limit, device, fields={"seq_len": args.seq_len, "target_len": 0})


def probe(args: argparse.Namespace, prober: Prober, key: Key) -> Any:
    batch, level = key
    candidate = Candidate(
        batch,
        args.global_batch // batch,
        args.precision,
        Checkpointing(level),
        "adamw_torch",
        attn_implementation="sdpa",
    )
    return prober(candidate, WARMUP, MEASURE)


def largest_fitting(args: argparse.Namespace, prober: Prober, level: str) -> Figures:
    """The level's largest batch that runs within the limit, probing down from the top."""
    regular, fallback = batch_choices(args.global_batch)
    tried = []
    for batch in sorted([*regular, *fallback], reverse=True):
        result = probe(args, prober, (batch, level))
        peak = (result.peak_memory_bytes or 0) // MIB
        tried.append({"batch": batch, "outcome": str(result.outcome), "peak_mib": peak})
        if score(result, prober.limit) > 0:
            return {"key": [batch, level], "peak_mib": peak, "tried": tried}
    return {"key": [], "tried": tried}


def auto_budget(args: argparse.Namespace, work: Path) -> str:
    """A limit between the peaks of one sample without checkpointing and with every 4th
    layer checkpointed (measured, no limit): the place where memory binds by a level."""
    with prober(args, work / "auto", None) as unlimited:
        off, quarter = (probe(args, unlimited, (1, level)) for level in ("off", "every-4"))
    peaks = [r.peak_memory_bytes for r in (off, quarter)]
    if None in peaks or peaks[1] >= peaks[0]:
        raise SystemExit(f"--budget auto: no gap between the levels' peaks ({off}, {quarter})")
    return f"{(peaks[0] + peaks[1]) // 2 // MIB}MiB"


def side_by_side(args: argparse.Namespace, work: Path) -> Figures:
    """Each level's largest fitting config, then those timed in interleaved rounds."""
    levels = [c.value for c in Checkpointing if args.device == "cuda" or c != Checkpointing.OFFLOAD]
    started = time.monotonic()
    with prober(args, work, parse_size(args.budget)) as limited:
        found = {level: largest_fitting(args, limited, level) for level in levels}
        keys = [tuple(f["key"]) for f in found.values() if f["key"]]
        truth = interleaved_rounds(
            lambda key: score(probe(args, limited, key), limited.limit), keys
        )
    return {
        "side_s": round(time.monotonic() - started),
        "levels": found,
        "truth": {
            f"{k[0]} {k[1]}": {
                "rounds": r,
                "ratio": truth.ratios.get(k),
                "half": truth.half_widths.get(k),
            }
            for k, r in truth.runs.items()
        },
        "best": list(truth.best),
    }


def measure(args: argparse.Namespace, work: Path) -> Figures:
    if args.quick:
        args.layers, args.global_batch = 2, 1
        args.budget, args.time_budget = "auto", "1m"
    if args.budget == "auto":
        args.budget = auto_budget(args, work)
        print(f"budget: {args.budget}", flush=True)
    model_folder(work, "model", model_config(args))
    figures: Figures = {
        "shape": f"GPT-2 shape, {args.layers} layers, hidden {args.hidden}, {args.heads} heads, "
        f"{args.seq_len} tokens, global batch {args.global_batch}, {args.precision}, "
        f"adamw_torch, limit {args.budget}, {args.device}",
    }
    if args.device == "cuda":  # on CUDA, the GPU is the machine that matters
        import torch

        figures["gpu"] = torch.cuda.get_device_name(0)
    if not args.search_only:
        figures.update(side_by_side(args, work))
    searched = search(
        work,
        "levels",
        *("--model", str(work / "model"), "--device", args.device),
        *("--global-batch-size", str(args.global_batch), "--seq-len", str(args.seq_len)),
        *("--precisions", args.precision, "--optimizers", "adamw_torch"),
        *("--lever", "attn_implementation=sdpa", "--lever", "torch_compile=false"),
        *("--memory-budget", args.budget, "--headroom", "0", "--time-budget", args.time_budget),
        *("--parity", "off", "--no-rehearse"),
    )
    figures["search"] = {
        "wall_s": searched.wall_s,
        "picked": (searched.best or {}).get("config"),
        "probed": searched.trials,
        "output": searched.output[-3000:],
    }
    return figures


def report(f: Figures) -> str:
    text = header(f, "Graded checkpointing where memory binds") + f"\n{f['shape']}"
    text += f" on {f['gpu']}.\n" if "gpu" in f else ".\n"
    if "levels" in f:
        rows = []
        for level, found in f["levels"].items():
            if not found["key"]:
                rows.append((level, "none", "", "", ""))
                continue
            t = f["truth"][f"{found['key'][0]} {level}"]
            speeds = [v for v in t["rounds"].values() if v > 0]
            median = statistics.median_high(speeds) if speeds else 0.0
            best = " (best)" if found["key"] == f["best"] else ""
            ratio = f"{t['ratio'] or 0:.3f} +-{t['half'] or 0:.1%}{best}"
            rows.append((level, found["key"][0], found["peak_mib"], f"{median:.2f}", ratio))
        columns = (
            "level",
            "largest batch that fits",
            "peak MiB",
            "samples/s (median)",
            "vs the best (95% CI)",
        )
        text += (
            f"\nEach level's largest batch within the limit, then those configs timed in "
            f"interleaved rounds ({f['side_s']} s):\n\n{table(columns, rows)}\n"
            f"The fastest level: **{f['best'][1]}** at batch {f['best'][0]}.\n"
        )
    s = f["search"]
    rows = [
        (
            t["config"],
            t["outcome"],
            f"{t['samples_per_s']:.2f}" if t["samples_per_s"] else "",
            f"{t['peak_memory_gib']:.2f}" if t["peak_memory_gib"] else "",
        )
        for t in s["probed"]
    ]
    return text + (
        f"\n`autotune search` under the same budget ({s['wall_s']} s) picked: "
        f"**{s['picked']}**, from:\n\n{table(('config', 'outcome', 'samples/s', 'peak GiB'), rows)}"
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--global-batch", type=int, default=4)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument(
        "--budget", default="1536MiB", help="auto: between one sample's peaks off and every-4"
    )
    parser.add_argument("--time-budget", default="4m")
    parser.add_argument(
        "--search-only", action="store_true", help="no side-by-side rounds: the search alone"
    )


if __name__ == "__main__":
    # a CUDA run's record apart from the CPU's (benchmarks/checkpoint_levels.json)
    cuda = any(word.endswith("cuda") for word in sys.argv[1:])
    name = "checkpoint_levels_cuda" if cuda else "checkpoint_levels"
    run(Benchmark(name, __doc__, measure, report, options))
