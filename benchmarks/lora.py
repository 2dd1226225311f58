#!/usr/bin/env python
"""A LoRA job against the stand-in: does tuning the stand-in (a full fine-tune built from
the model's config) pick what suits the LoRA job the user runs?

In one run: search the user's job (a LoRA adapter, r=16 on the attention and MLP
projections, in TRL's SFTTrainer on a small Qwen2-style model: `--trainer`), then the
stand-in (`--model` the same folder) with the same budget, global batch and time; then
run both picks in the LoRA job, alternating, each a fresh probe process under the same
memory limit: samples/s and peak of the stand-in's pick against the LoRA search's own.

    python benchmarks/lora.py [--quick] [--record] [--budget 2GiB]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from statistics import median
from typing import Any

from _user_job import checkpoint, write_job
from harness import Benchmark, Figures, Searched, header, run, search, table

JOB = """
from pathlib import Path

from trl import SFTConfig

HERE = Path(__file__).parent


def make_trainer(args: SFTConfig):
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(HERE / "model"),
        args=args,
        train_dataset=load_dataset("json", data_files=str(HERE / "train.jsonl"), split="train"),
        processing_class=AutoTokenizer.from_pretrained(HERE / "tokenizer"),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules=targets),
    )
"""
RECIPE = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 2,
    "learning_rate": 2e-4,
    "max_length": 64,
    "dataset_text_field": "text",
    "bf16": False,
}


def prepare(work: Path, quick: bool) -> None:
    """The tests' tokenizer and data, a Qwen2-style model of ~40M parameters (`quick`: 64
    wide, 2 layers), the LoRA script and its recipe."""
    write_job(work)
    hidden, wide, layers, heads = (64, 128, 2, 4) if quick else (512, 1408, 8, 8)
    checkpoint(
        work,
        "model",
        "qwen2",
        hidden_size=hidden,
        intermediate_size=wide,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=512,
    )
    (work / "lora_job.py").write_text(JOB)
    (work / "base.json").write_text(json.dumps(RECIPE))


def picked(searched: Searched) -> Figures:
    best = searched.best or {}
    return {
        "config": best["config"],
        "arguments": best["training_arguments"],
        "samples_per_s": best["samples_per_s"],
        "peak_gib": best["peak_memory_gib"],
        "probes": len(searched.probes),
        "search_s": round(searched.wall_s),
    }


def in_the_job(work: Path, arguments: dict[str, Any]) -> Figures:
    """The LoRA job trained with these tuned fields as a probe of the LoRA study runs it:
    a fresh process, the study's memory limit and measurement."""
    template = next((work / "studies/lora/trials").glob("*/config.json"))
    config = json.loads(template.read_text())
    folder = work / "runs" / str(len(list(work.glob("runs/*"))))
    folder.mkdir(parents=True)
    candidate = {
        **config["candidate"],
        "per_device_train_batch_size": arguments["per_device_train_batch_size"],
        "gradient_accumulation_steps": arguments["gradient_accumulation_steps"],
        "precision": "bf16" if arguments.get("bf16") else "fp32",
        "activation_checkpointing": bool(arguments.get("activation_checkpointing")),
        "optim": arguments["optim"],
        "torch_compile": bool(arguments.get("torch_compile")),
        "attn_implementation": "",
    }
    trial = {
        **config,
        "trial_dir": str(folder),
        "candidate": candidate,
        "training_arguments": {**config["training_arguments"], **arguments},
        "adaptive": False,
        "incumbent_s": None,
    }
    (folder / "config.json").write_text(json.dumps(trial))
    probe = [sys.executable, "-m", "autotune.probe", str(folder / "config.json")]
    subprocess.run(probe, cwd=work, capture_output=True, check=False)
    result = json.loads((folder / "result.json").read_text())
    return {
        "outcome": result["outcome"],
        "samples_per_s": result.get("samples_per_s"),
        "peak_gib": (result.get("peak_memory_bytes") or 0) / 2**30,
    }


def measure(args: argparse.Namespace, work: Path) -> Figures:
    prepare(work, args.quick)
    minutes, rounds = ("1m", 1) if args.quick else ("5m", 3)
    common = ["--device", "cpu", "--memory-budget", args.budget, "--time-budget", minutes]
    common += ["--lever", "torch_compile=false", "--parity", "off", "--quiet"]
    common += ["--precisions", "fp32,bf16", "--global-batch-size", "16"]
    factory = ("--trainer", "lora_job.py:make_trainer", "--base-args", "base.json")
    lora = search(work, "lora", *factory, *common)
    # the stand-in at the LoRA study's sequence length (its data's longest sample)
    seq_len = lora.shown["description"].rsplit("; ", 1)[-1].split()[0]
    model = ("--model", "./model", "--lever", "attn_implementation=sdpa", "--seq-len", seq_len)
    stand_in = search(work, "stand-in", *model, *common)
    picks = {"lora pick": picked(lora), "stand-in pick": picked(stand_in)}
    runs: dict[str, list[Figures]] = {name: [] for name in picks}
    for _ in range(rounds):  # alternating: the host's drift falls on both
        for name, pick in picks.items():
            runs[name].append(in_the_job(work, pick["arguments"]))
    config = json.loads((work / "model/config.json").read_text())
    return {
        "model": f"Qwen2-style, hidden {config['hidden_size']}, "
        f"{config['num_hidden_layers']} layers, vocab {config['vocab_size']}",
        "budget": args.budget,
        "time_budget": minutes,
        "lora_search": picks["lora pick"],
        "stand_in_search": picks["stand-in pick"],
        "in_the_lora_job": runs,
    }


def cell(runs: list[dict[str, Any]]) -> str:
    ok = [r for r in runs if r["outcome"] == "ok"]
    if not ok:
        return ", ".join(r["outcome"] for r in runs)
    speed = median(r["samples_per_s"] for r in ok)
    return f"{speed:.1f} samples/s (median of {len(ok)}), peak {max(r['peak_gib'] for r in ok):.2f} GiB"


def report(f: Figures) -> str:
    rows = [
        (
            label,
            s["config"],
            f"{s['samples_per_s']:.1f}, {s['peak_gib']:.2f} GiB",
            f"{s['probes']}, {s['search_s']} s",
            cell(f["in_the_lora_job"][pick]),
        )
        for label, s, pick in (
            ("LoRA job (`--trainer`)", f["lora_search"], "lora pick"),
            ("stand-in (`--model`, full fine-tune)", f["stand_in_search"], "stand-in pick"),
        )
    ]
    columns = ("search", "selected", "its samples/s, peak", "probes, time", "in the LoRA job")
    return (
        header(f, "LoRA job vs the stand-in")
        + f"\nModel: {f['model']}. Budget {f['budget']}, {f['time_budget']} per search, "
        "global batch 16, parity off.\n\n" + table(columns, rows)
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", default="2GiB", help="the memory budget of both searches")


if __name__ == "__main__":
    run(Benchmark("lora", __doc__, measure, report, options))
