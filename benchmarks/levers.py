#!/usr/bin/env python
"""The levers beyond the classic five (#17), measured: what compilation and the attention
kernel gain against the best config without them.

Per model, one search over a space small enough to probe whole (so the best without the
levers is measured too, not guessed), selected by time to finish --train-steps; the
table sets side by side the plain default (the search's first probe), the best of the
classic dimensions alone (levers at their plain values), the best with the levers, and
the highest throughput. Run it alone on the machine: the figures are throughputs.

    python benchmarks/levers.py                  # both models, about 20 minutes on 2 cores
    python benchmarks/levers.py --models gpt2
    python benchmarks/levers.py --quick          # a 2-layer GPT-2, the same space
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import Benchmark, Figures, gpt2, header, model_folder, run, search, table

STEPS = 1000
MODELS = {
    # the README's main job's shapes; the attention kept at sdpa (8 configs, 4 compiled)
    "google/mt5-small": [
        *("--global-batch-size", "16", "--seq-len", "64", "--target-len", "16"),
        *("--lever", "attn_implementation=sdpa"),
    ],
    # a small causal LM (124M): one batch split, sdpa and eager (8 configs, 4 compiled)
    "gpt2": ["--global-batch-size", "8", "--seq-len", "128"],
}
COMMON = [
    *("--precisions", "fp32,bf16", "--optimizers", "adamw_torch", "--checkpointing", "off"),
    *("--measure-steps", "3", "--max-trials", "8", "--confirm-top", "0", "--parity", "off"),
    *("--train-steps", str(STEPS)),
]


def searched(model: str, work: Path, quick: bool) -> Figures:
    where = str(model_folder(work, "gpt2-2-layers", gpt2())) if quick else model
    s = search(work, model.replace("/", "-"), "--model", where, *MODELS[model], *COMMON)
    ok = [t for t in s.trials if t["outcome"] == "ok"]
    plain_levers = {n: v[0] for n, v in s.shown["levers"].items()}

    def plain(t: Figures) -> bool:
        compiled = bool(t["training_arguments"].get("torch_compile", False))
        attn = str(t["config"]).split()[-1] if plain_levers else ""
        return compiled == plain_levers.get("torch_compile", False) and (
            "attn_implementation" not in plain_levers or attn == plain_levers["attn_implementation"]
        )

    rows = {
        "plain default": min(ok, key=lambda t: t["trial"]),  # the search's first probe
        "best without levers": min((t for t in ok if plain(t)), key=lambda t: t["finish_s"]),
        "best with levers (selected)": s.best,
        "highest throughput": max(ok, key=lambda t: t["samples_per_s"]),
    }
    return {
        "model": model,
        "search_wall_s": s.wall_s,
        "probed": len(s.trials),
        "levers": s.shown["levers"],
        "not_offered": s.shown["levers_not_offered"],
        "rows": {
            name: {
                "config": t["config"],
                "samples_per_s": t["samples_per_s"],
                "one_time_s": t["one_time_s"],
                "finish_1000_steps_s": t["finish_s"],
                "peak_gib": t["peak_memory_gib"],
            }
            for name, t in rows.items()
        },
    }


def measure(args: argparse.Namespace, work: Path) -> Figures:
    models = ["gpt2"] if args.quick else args.models
    return {"results": [searched(model, work, args.quick) for model in models]}


def report(f: Figures) -> str:
    rows = [
        (
            f"{r['model']}",
            f"{name}: {row['config']}",
            f"{row['samples_per_s']:.2f}",
            f"{row['one_time_s']:.1f}",
            f"{row['finish_1000_steps_s']:.0f} s",
            f"{row['peak_gib']:.2f}",
        )
        for r in f["results"]
        for name, row in r["rows"].items()
    ]
    searches = "; ".join(
        f"{r['model']}: {r['probed']} configs in {r['search_wall_s']:.0f} s, levers {r['levers']}"
        for r in f["results"]
    )
    columns = ("model", "config", "samples/s", "one-time s", f"{STEPS} steps", "peak GiB")
    return (
        header(f, "The levers beyond the classic five: compilation and attention kernels")
        + f"\n{STEPS} steps: the one-time cost plus {STEPS} x the measured median step. "
        f"Searches: {searches}.\n\n" + table(columns, rows)
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))


if __name__ == "__main__":
    run(Benchmark("levers", __doc__, measure, report, options))
