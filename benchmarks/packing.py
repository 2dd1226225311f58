#!/usr/bin/env python
"""Packed rows against padded batches in a LoRA SFTTrainer job, on this machine: what the
search reads against what the user's own run takes to train the same samples.

The job: the tests' LoRA factory on a small bf16-stored Llama (32k vocabulary), samples
of 5 to 60 words, `max_length` 512, recipe 8 x 2, searched with `--lever
packing=false,true` (precision and optimizer the recipe's). The truth: the user's factory
trains one epoch with the search's best padded config and its best packed one, in
interleaved rounds (samples/s after the first step). The packed / padded ratio by the
search is set beside the ratio by those epochs.

    python benchmarks/packing.py [--record] [--rounds 2] [--time-budget 3m]
    python benchmarks/packing.py --quick  # 240 samples, 4 minutes of probes alone, one round
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import median

from _user_job import texts, their_run
from harness import Benchmark, Figures, header, run, search, table
from jobs import prepare

SAMPLES = 960  # an epoch: 60 padded steps of 16, fewer packed ones


def measure(args: argparse.Namespace, work: Path) -> Figures:
    prepare(work, quick=True, long=False)
    samples, minutes, rounds = (SAMPLES // 4, "4m", 1) if args.quick else (SAMPLES, "3m", 2)
    # end to end: the probes alone, so that both a padded and a packed one run in time
    shorter = ("--no-rehearse", "--confirm-top", "0", "--parity", "off") if args.quick else ()
    minutes, rounds = args.time_budget or minutes, args.rounds or rounds
    texts(work / "train.jsonl", samples, (5, 60))  # no sample cut at 512 tokens
    script = work / "job.py"
    script.write_text(script.read_text().replace("BITS = 4", "BITS = 16"))
    recipe = json.loads((work / "lora.json").read_text())
    recipe |= {"max_length": 512, "gradient_accumulation_steps": 2}
    (work / "lora.json").write_text(json.dumps(recipe))
    searched = search(
        work,
        "packing",
        *("--trainer", "job.py:qlora", "--base-args", "lora.json", "--device", "cpu"),
        *("--memory-budget", args.budget, "--time-budget", minutes),
        *("--lever", "torch_compile=false", "--lever", "packing=false,true"),
        *("--precisions", "as-loaded", "--optimizers", "adamw_torch", "--checkpointing", "off"),
        *shorter,
    )
    trials = [t for t in searched.trials if t["outcome"] == "ok"]
    packed = [t for t in trials if t.get("samples_per_step")]
    padded = [t for t in trials if not t.get("samples_per_step")]
    if not packed or not padded:
        raise SystemExit(f"the search probed no packed or no padded config: {trials}")
    picks = {
        "padded": max(padded, key=lambda t: t["samples_per_s"]),
        "packed": max(packed, key=lambda t: t["samples_per_s"]),
    }
    epoch = {"max_steps": -1, "num_train_epochs": 1, "save_strategy": "no", "report_to": "none"}
    truth: dict[str, list[float]] = {name: [] for name in picks}
    for _ in range(rounds):
        for name, trial in picks.items():
            fields = {**recipe, **trial["training_arguments"], **epoch}
            ran = their_run(work, "job:qlora", {**fields, "output_dir": str(work / name)})
            if "error" in ran:
                raise SystemExit(f"the {name} epoch failed: {ran['error']}")
            truth[name].append(round(ran["samples_per_s"], 2))
    by_search = picks["packed"]["samples_per_s"] / picks["padded"]["samples_per_s"]
    by_epochs = median(truth["packed"]) / median(truth["padded"])
    return {
        "samples": samples,
        "search_s": round(searched.wall_s),
        "probes": len(trials),
        "pick": (searched.best or {}).get("config"),
        "configs": {
            name: {
                "config": t["config"],
                "search_samples_per_s": t["samples_per_s"],
                "samples_per_step": t.get("samples_per_step"),
                "peak_gib": t["peak_memory_gib"],
                "predicted_peak_gib": t["predicted_peak_gib"],
                "parity": t["parity"],
                "epoch_samples_per_s": truth[name],
            }
            for name, t in picks.items()
        },
        "packed_over_padded": {"search": round(by_search, 3), "epochs": round(by_epochs, 3)},
    }


def report(f: Figures) -> str:
    rows = [
        (
            name,
            c["config"],
            c["samples_per_step"] or "",
            f"{c['search_samples_per_s']:.2f}",
            ", ".join(f"{x:.2f}" for x in c["epoch_samples_per_s"]),
            f"{c['predicted_peak_gib']:.2f} / {c['peak_gib']:.2f} GiB",
            c["parity"],
        )
        for name, c in f["configs"].items()
    ]
    columns = ("", "config", "samples a step", "samples/s by the search", "by epochs")
    ratio = f["packed_over_padded"]
    return (
        header(f, "Packed rows against padded batches")
        + f"\nA LoRA job on a small bf16 Llama, {f['samples']} samples of 5-60 words, "
        f"`--lever packing=false,true`: {f['probes']} probes, {f['search_s']} s, export "
        f"{f['pick']}. By epochs: the user's factory, one epoch each, interleaved.\n\n"
        + table((*columns, "estimate / peak", "parity"), rows)
        + f"\nPacked over padded: {ratio['search']} by the search, {ratio['epochs']} by the "
        "epochs.\n"
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, help="interleaved epochs of each (2; --quick 1)")
    parser.add_argument("--budget", default="3GiB")
    parser.add_argument(
        "--time-budget", help="of the search (default 3m, 4m of probes alone with --quick)"
    )


if __name__ == "__main__":
    run(Benchmark("packing", __doc__, measure, report, options))
