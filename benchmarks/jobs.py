#!/usr/bin/env python
"""The jobs users bring, searched in one run: what each picks, and how close the memory
estimate comes to what the probes measured.

One bf16-stored Llama checkpoint (~58M parameters: a 32k vocabulary, untied head) as
three jobs: LoRA on it, QLoRA (loaded in 4-bit NF4, prepared for k-bit training, LoRA on
every linear layer), and the full fine-tuning stand-in built from its config. For each:
the pick, its samples/s, the probes, and the analytic estimate (the job as held, before
any probe refines it) over every probe's measured peak.

    python benchmarks/jobs.py [--quick] [--record]
    python benchmarks/jobs.py --device cuda --budget 20GiB --jobs qlora --work /tmp/jobs
    python benchmarks/jobs.py --device cuda --budget 20GiB --jobs qlora --long \
        --attention flex_attention  # padding-free batches where they pay
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path
from statistics import median

from _user_job import BASE_ARGS, checkpoint, texts, write_job
from harness import Benchmark, Figures, Searched, autotune, header, run, show, table

JOBS = ("qlora", "lora", "full")  # QLoRA, LoRA on the bf16 base, the full fine-tuning stand-in


def prepare(work: Path, quick: bool, long: bool) -> None:
    """The tests' job with the checkpoint above (`quick`: 128 wide, 2 layers). `long`:
    samples of about 50 to 1700 tokens, none cut (max_length 2048), where a batch padded
    to its longest sample is about half padding."""
    write_job(work)
    hidden, layers = (128, 2) if quick else (512, 8)
    checkpoint(
        work,
        "model-bf16",
        "llama",
        bf16=True,
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048 if long else 512,
    )
    recipe = {**BASE_ARGS, "per_device_train_batch_size": 8, "learning_rate": 2e-4}
    if long:
        texts(work / "train.jsonl", 120, (10, 300))
        recipe["max_length"] = 2048
    (work / "lora.json").write_text(json.dumps(recipe))
    qlora = {**recipe, "bf16": True, "optim": "paged_adamw_8bit"}
    (work / "qlora.json").write_text(json.dumps(qlora))


def search(work: Path, study: str, *flags: str) -> Figures:
    """One job's search, what it said (and when) kept in STUDY.search.log; its figures."""
    started = time.monotonic()
    done = autotune(work, "search", "--study", study, *flags, stamped=True)
    (work / f"{study}.search.log").write_text(done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"{study} search failed:\n{done.stdout[-3000:]}")
    return figures(Searched(time.monotonic() - started, show(work, study)))


def figures(searched: Searched) -> Figures:
    best = searched.best or {}
    trials = searched.probes
    ratios = [
        t["predicted_peak_gib"] / t["peak_memory_gib"]
        for t in trials
        if t["predicted_peak_gib"] and t["peak_memory_gib"]
    ]
    return {
        "description": searched.shown["description"],
        "pick": best["config"],
        "samples_per_s": best["samples_per_s"],
        "peak_gib": best["peak_memory_gib"],
        "probes": len(trials),
        "configs_probed": sorted({t["config"] for t in trials}),
        "estimate_over_peak": {
            "median": round(median(ratios), 3) if ratios else None,
            "lowest": round(min(ratios), 3) if ratios else None,
            "highest": round(max(ratios), 3) if ratios else None,
            "probes": len(ratios),
        },
        "search_s": round(searched.wall_s),
    }


def measure(args: argparse.Namespace, work: Path) -> Figures:
    chosen = args.jobs.split(",")
    if unknown := set(chosen) - set(JOBS):
        raise SystemExit(f"--jobs: no job named {', '.join(sorted(unknown))}; choose from {JOBS}")
    work = args.work or work
    work.mkdir(parents=True, exist_ok=True)
    prepare(work, args.quick, args.long)
    minutes = args.time_budget or ("1m" if args.quick else "3m")
    common = ["--device", args.device, "--memory-budget", args.budget, "--time-budget", minutes]
    common += ["--lever", "torch_compile=false", "--quiet", *shlex.split(args.also)]
    script = work / "job.py"
    if args.attention:
        loads = f"ATTENTION = {args.attention!r}"
        script.write_text(script.read_text().replace("ATTENTION = None", loads))
    jobs = {}
    if "qlora" in chosen:
        qlora = ("--trainer", "job.py:qlora", "--base-args", "qlora.json")
        jobs["qlora"] = search(work, "qlora", *qlora, *common)
    script.write_text(script.read_text().replace("BITS = 4", "BITS = 16"))
    if "lora" in chosen:
        lora = ("--trainer", "job.py:qlora", "--base-args", "lora.json")
        jobs["lora on bf16"] = search(work, "lora", *lora, *common)
    if "full" in chosen:
        full = ("--model", "./model-bf16", "--global-batch-size", "16", "--seq-len", "64")
        jobs["full fine-tune stand-in"] = search(work, "full", *full, *common)
    return {"device": args.device, "budget": args.budget, "time_budget": minutes, "jobs": jobs}


def report(f: Figures) -> str:
    rows = [
        (
            name,
            r["pick"],
            f"{r['samples_per_s']:.2f}",
            f"{r['peak_gib']:.2f} GiB",
            f"{e['median']} ({e['lowest']}-{e['highest']}, {e['probes']} probes)",
            r["probes"],
            f"{r['search_s']} s",
        )
        for name, r in f["jobs"].items()
        for e in [r["estimate_over_peak"]]
    ]
    columns = ("job", "pick", "samples/s", "peak", "estimate / peak: median (range)")
    return (
        header(f, "The jobs users bring")
        + f"\nOn {f['device']} under {f['budget']}, `--time-budget {f['time_budget']}` each.\n\n"
        + table((*columns, "probes", "search"), rows)
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", default="3GiB", help="the memory budget of every search")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (the QLoRA base too)")
    parser.add_argument("--time-budget", help="of every search (default 3m, 1m with --quick)")
    parser.add_argument("--jobs", default=",".join(JOBS), help=f"which of {', '.join(JOBS)}")
    parser.add_argument("--long", action="store_true", help="samples of 50-1700 tokens")
    parser.add_argument("--attention", help="the factories' attention, e.g. flex_attention")
    parser.add_argument("--work", type=Path, help="a folder to keep: its studies and logs")
    parser.add_argument("--also", default="", help="more `autotune search` options for each")


if __name__ == "__main__":
    run(Benchmark("jobs", __doc__, measure, report, options))
