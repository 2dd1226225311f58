#!/usr/bin/env python
"""A LoRA job against the stand-in: does tuning the stand-in (a full fine-tune built from
the model's config) pick what suits the LoRA job the user runs?

On one machine, in one run:
1. search the user's job: a LoRA adapter (r=16 on the attention and MLP projections)
   inside TRL's SFTTrainer on a small Qwen2-style causal LM loaded with
   from_pretrained, their jsonl text (`--trainer lora_job.py:make_trainer`);
2. the same search of the stand-in (`--model` the same folder: a full fine-tune on
   synthetic batches of the same length), same budget, global batch and time;
3. run both picks in the LoRA job, alternating, each run a fresh probe process under
   the same memory limit: samples/s and peak of the stand-in's pick against the LoRA
   search's own.

    python benchmarks/lora.py [--no-append] [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from _common import ROOT, autotune, machine, save

sys.path.insert(0, str(ROOT / "tests"))
from job_script import write_job  # the tests' job; a bigger model below

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


def prepare(work: Path, quick: bool) -> Path:
    """The tests' job (tokenizer, jsonl), with a bigger model: ~40M parameters."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    write_job(work)
    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    size = (64, 128, 2) if quick else (512, 1408, 8)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=size[0],
        intermediate_size=size[1],
        num_hidden_layers=size[2],
        num_attention_heads=8 if not quick else 4,
        num_key_value_heads=4 if not quick else 2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    shutil.rmtree(work / "model")
    Qwen2ForCausalLM(config).save_pretrained(work / "model")
    (work / "lora_job.py").write_text(JOB, encoding="utf-8")
    base = {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "learning_rate": 2e-4,
        "max_length": 64,
        "dataset_text_field": "text",
        "bf16": False,
    }
    (work / "base.json").write_text(json.dumps(base), encoding="utf-8")
    return work


def search(work: Path, study: str, job: list[str], options: list[str]) -> dict[str, Any]:
    started = time.monotonic()
    done = autotune(work, "search", *job, "--study", study, *options)
    if done.returncode != 0:
        raise SystemExit(f"{study} search failed:\n{done.stderr[-3000:]}")
    shown = json.loads(autotune(work, "show", "--study", study, "--format", "json").stdout)
    best = next(t for t in shown["trials"] if t["best"])
    return {
        "config": best["config"],
        "arguments": best["training_arguments"],
        "samples_per_s": best["samples_per_s"],
        "peak_gib": best["peak_memory_gib"],
        "probes": sum(1 for t in shown["trials"] if t["outcome"] != "skipped"),
        "search_s": round(time.monotonic() - started),
    }


def run_in_job(work: Path, arguments: dict[str, Any], rounds: int) -> list[dict[str, Any]]:
    """The LoRA job trained with these tuned fields, as a probe of the LoRA study runs
    it (a fresh process, the study's memory limit and measurement), `rounds` times."""
    template = next((work / "studies/lora/trials").glob("*/config.json"))
    config = json.loads(template.read_text())
    runs = []
    for _ in range(rounds):
        folder = Path(tempfile.mkdtemp(dir=work, prefix="run-"))
        fields = {**config["training_arguments"], **arguments}
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
            "training_arguments": fields,
            "adaptive": False,
            "incumbent_s": None,
        }
        (folder / "config.json").write_text(json.dumps(trial))
        subprocess.run(
            [sys.executable, "-m", "autotune.probe", str(folder / "config.json")],
            cwd=work,
            capture_output=True,
            check=False,
        )
        result = json.loads((folder / "result.json").read_text())
        runs.append(
            {
                "outcome": result["outcome"],
                "samples_per_s": result.get("samples_per_s"),
                "peak_gib": (result.get("peak_memory_bytes") or 0) / 2**30,
            }
        )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 1-minute searches")
    parser.add_argument("--budget", default="2GiB", help="the memory budget of both searches")
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="autotune-lora-"))
    prepare(work, options.quick)
    minutes, rounds = ("1m", 1) if options.quick else ("5m", 3)
    budget = options.budget
    common = [
        "--device",
        "cpu",
        "--memory-budget",
        budget,
        "--time-budget",
        minutes,
        "--lever",
        "torch_compile=false",
        "--parity",
        "off",
        "--quiet",
        "--precisions",
        "fp32,bf16",
        "--global-batch-size",
        "16",
    ]
    lora = search(
        work, "lora", ["--trainer", "lora_job.py:make_trainer", "--base-args", "base.json"], common
    )
    stand_in = search(
        work,
        "stand-in",
        ["--model", "./model", "--lever", "attn_implementation=sdpa"],
        [*common, "--seq-len", str(_seq_len(work))],
    )
    runs: dict[str, list[dict[str, Any]]] = {"lora pick": [], "stand-in pick": []}
    for _ in range(rounds):  # alternating: the host's drift falls on both
        runs["lora pick"] += run_in_job(work, lora["arguments"], 1)
        runs["stand-in pick"] += run_in_job(work, stand_in["arguments"], 1)
    figures = {
        **machine(),
        "model": _model_line(work),
        "budget": budget,
        "time_budget": minutes,
        "lora_search": lora,
        "stand_in_search": stand_in,
        "in_the_lora_job": runs,
    }
    save("lora", figures, _markdown(figures), append=not options.no_append)
    shutil.rmtree(work, ignore_errors=True)


def _seq_len(work: Path) -> int:
    """The LoRA study's sequence length (its data's longest sample), for the stand-in."""
    spec = json.loads(autotune(work, "show", "--study", "lora", "--format", "json").stdout)
    return int(spec["description"].rsplit("; ", 1)[-1].split()[0])


def _model_line(work: Path) -> str:
    config = json.loads((work / "model/config.json").read_text())
    return (
        f"Qwen2-style, hidden {config['hidden_size']}, {config['num_hidden_layers']} layers, "
        f"vocab {config['vocab_size']}"
    )


def _markdown(f: dict[str, Any]) -> str:
    def cell(runs: list[dict[str, Any]]) -> str:
        ok = [r for r in runs if r["outcome"] == "ok"]
        if not ok:
            return ", ".join(r["outcome"] for r in runs)
        speed = median(r["samples_per_s"] for r in ok)
        peak = max(r["peak_gib"] for r in ok)
        return f"{speed:.1f} samples/s (median of {len(ok)}), peak {peak:.2f} GiB"

    lora, stand = f["lora_search"], f["stand_in_search"]
    runs = f["in_the_lora_job"]
    return (
        f"\n## LoRA job vs the stand-in ({f['date']})\n\n"
        f"{f['machine']}; {f['versions']}. Model: {f['model']}. Budget {f['budget']}, "
        f"{f['time_budget']} per search, global batch 16, parity off. Script: "
        "`python benchmarks/lora.py`.\n\n"
        "| search | selected | its samples/s, peak | probes, time | in the LoRA job |\n"
        "| --- | --- | --- | --- | --- |\n"
        f"| LoRA job (`--trainer`) | {lora['config']} | {lora['samples_per_s']:.1f}, "
        f"{lora['peak_gib']:.2f} GiB | {lora['probes']}, {lora['search_s']} s | "
        f"{cell(runs['lora pick'])} |\n"
        f"| stand-in (`--model`, full fine-tune) | {stand['config']} | "
        f"{stand['samples_per_s']:.1f}, {stand['peak_gib']:.2f} GiB | {stand['probes']}, "
        f"{stand['search_s']} s | {cell(runs['stand-in pick'])} |\n"
    )


if __name__ == "__main__":
    main()
