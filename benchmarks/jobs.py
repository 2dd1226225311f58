#!/usr/bin/env python
"""The jobs users bring, searched on this machine in one run: a LoRA job on a checkpoint
stored in bf16, the same job as QLoRA (the checkpoint loaded in 4-bit NF4, prepared for
k-bit training, LoRA on every linear layer), and the full fine-tuning stand-in built from
the same config. For each: the pick, its samples/s, how many probes ran, and the analytic
memory estimate (the job as held, before any probe refines it) against every probe's
measured peak.

    python benchmarks/jobs.py [--no-append] [--quick]
    python benchmarks/jobs.py --device cuda --budget 20GiB --jobs qlora --no-append
    python benchmarks/jobs.py --device cuda --budget 20GiB --jobs qlora --long \
        --attention flex_attention --no-append  # padding-free batches where they pay
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from _common import ROOT, autotune, machine, save

sys.path.insert(0, str(ROOT / "tests"))
from job_script import BASE_ARGS, WORDS, write_job  # the tests' job; a bigger model below

JOBS = ("qlora", "lora", "full")  # QLoRA, LoRA on the bf16 base, the full fine-tuning stand-in


def prepare(work: Path, quick: bool, long: bool) -> Path:
    """The tests' job (tokenizer, jsonl, the qlora factory) with a bigger checkpoint,
    stored in bf16: a Llama of ~58M parameters (a 32k vocabulary, untied head). `long`:
    samples of about 50 to 1700 tokens, none cut (max_length 2048), where a batch padded
    to its longest sample is about half padding."""
    import random

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    write_job(work)
    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    hidden, layers = (128, 2) if quick else (512, 8)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048 if long else 512,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    shutil.rmtree(work / "model-bf16")
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(work / "model-bf16")
    recipe = {**BASE_ARGS, "per_device_train_batch_size": 8, "learning_rate": 2e-4}
    if long:
        rng = random.Random(0)
        lines = [" ".join(rng.choices(WORDS, k=rng.randint(10, 300))) for _ in range(120)]
        (work / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
        recipe["max_length"] = 2048
    (work / "lora.json").write_text(json.dumps(recipe))
    qlora = {**recipe, "bf16": True, "optim": "paged_adamw_8bit"}
    (work / "qlora.json").write_text(json.dumps(qlora))
    return work


def search(work: Path, study: str, job: list[str], options: list[str]) -> dict[str, Any]:
    started = time.monotonic()
    done = autotune(work, "search", *job, "--study", study, *options, stamped=True)
    (work / f"{study}.search.log").write_text(done.stdout)  # what it said, and when
    if done.returncode != 0:
        raise SystemExit(f"{study} search failed:\n{done.stdout[-3000:]}")
    shown = json.loads(autotune(work, "show", "--study", study, "--format", "json").stdout)
    trials = [t for t in shown["trials"] if t["outcome"] != "skipped"]
    best = next(t for t in trials if t["best"])
    ratios = [
        t["predicted_peak_gib"] / t["peak_memory_gib"]
        for t in trials
        if t["predicted_peak_gib"] and t["peak_memory_gib"]
    ]
    return {
        "description": shown["description"],
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
        "search_s": round(time.monotonic() - started),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 1-minute searches")
    parser.add_argument("--budget", default="3GiB", help="the memory budget of every search")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (the QLoRA base too)")
    parser.add_argument("--time-budget", help="of every search (default 3m, 1m with --quick)")
    parser.add_argument(
        "--jobs", default=",".join(JOBS), help=f"which of {', '.join(JOBS)} (comma-separated)"
    )
    parser.add_argument(
        "--long", action="store_true", help="samples of 50 to 1700 tokens (max_length 2048)"
    )
    parser.add_argument(
        "--attention", help="the kernel the QLoRA and LoRA factories load with, e.g. flex_attention"
    )
    parser.add_argument(
        "--also",
        default="",
        help='more `autotune search` options for every job, e.g. "--checkpointing every-2,on"',
    )
    options = parser.parse_args()
    chosen = options.jobs.split(",")
    if unknown := set(chosen) - set(JOBS):
        parser.error(f"--jobs: no job named {', '.join(sorted(unknown))}; choose from {JOBS}")
    work = prepare(Path(tempfile.mkdtemp(prefix="autotune-jobs-")), options.quick, options.long)
    minutes = options.time_budget or ("1m" if options.quick else "3m")
    common = ["--device", options.device, "--memory-budget", options.budget]
    common += ["--time-budget", minutes, "--lever", "torch_compile=false", "--quiet"]
    common += shlex.split(options.also)
    factory = ["--trainer", "job.py:qlora"]
    script = work / "job.py"
    if options.attention:
        loads = f"ATTENTION = {options.attention!r}"
        script.write_text(script.read_text().replace("ATTENTION = None", loads))
    results = {}
    if "qlora" in chosen:
        results["qlora"] = search(work, "qlora", [*factory, "--base-args", "qlora.json"], common)
    script.write_text(script.read_text().replace("BITS = 4", "BITS = 16"))
    if "lora" in chosen:
        lora = [*factory, "--base-args", "lora.json"]
        results["lora on bf16"] = search(work, "lora", lora, common)
    if "full" in chosen:
        stand_in = ["--model", "./model-bf16", "--global-batch-size", "16", "--seq-len", "64"]
        results["full fine-tune stand-in"] = search(work, "full", stand_in, common)
    figures = {
        **machine(),
        "device": options.device,
        "budget": options.budget,
        "time_budget": minutes,
        "jobs": results,
    }
    save("jobs", figures, _markdown(figures), append=not options.no_append)


def _markdown(figures: dict[str, Any]) -> str:
    rows = []
    for name, r in figures["jobs"].items():
        e = r["estimate_over_peak"]
        rows.append(
            f"| {name} | {r['pick']} | {r['samples_per_s']:.2f} | {r['peak_gib']:.2f} GiB | "
            f"{e['median']} ({e['lowest']}-{e['highest']}, {e['probes']} probes) | "
            f"{r['probes']} | {r['search_s']} s |"
        )
    return (
        f"\n## The jobs users bring ({figures['date']}, {figures['machine']})\n\n"
        f"`python benchmarks/jobs.py`: one bf16-stored Llama checkpoint (~58M parameters), "
        f"searched as {', '.join(figures['jobs'])} in one run on {figures['device']} under "
        f"{figures['budget']} and "
        f"`--time-budget {figures['time_budget']}` each. Estimate/peak: the analytic "
        "estimate before any probe (weights as held) over each probe's measured peak.\n\n"
        "| job | pick | samples/s | peak | estimate / peak: median (range) | probes | "
        "search |\n| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
    )


if __name__ == "__main__":
    main()
