#!/usr/bin/env python
"""Checks first, measured: a job that evaluates and saves, searched under short budgets,
then the user's own script run with what was exported, under the same memory.

The job: an `SFTTrainer` full fine-tune of a small Olmo2-style model (32k vocabulary,
~20M parameters), 128 evaluation samples of up to 128 tokens, evaluation batch 64, an
evaluation and a checkpoint every 2 steps, 2 GiB; its `compute_metrics` keeps the logits
(`logits`: no evaluation batch fits, whatever the config), or takes their argmax first
(`argmax`: a smaller evaluation batch fits). For each case (a variant at a time budget):
the search's wall, exit and last line, its export, and whether the user's script trains
4 steps with the export, evaluating and saving, under the same 2 GiB.

    python benchmarks/evaluation_job.py [--record] [--cases logits:3m,argmax:3m,logits:6m]
    python benchmarks/evaluation_job.py --quick  # argmax:1m
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from _user_job import WORDS, checkpoint, their_run, write_job
from harness import Benchmark, Figures, autotune, header, run, table

BUDGET = "2GiB"
LIMIT = 2 * 2**30  # the user's run: the same 2 GiB
CASES = "logits:3m,argmax:3m,logits:6m"

SCRIPT = """
from pathlib import Path

from trl import SFTConfig

HERE = Path(__file__).parent


def _accuracy(prediction):
    ids, labels = prediction.predictions, prediction.label_ids
    if ids.ndim == 3:  # the logits themselves, kept by the Trainer
        ids = ids.argmax(-1)
    return {"accuracy": float((ids[:, :-1] == labels[:, 1:]).mean())}


def _argmax(logits, labels):
    return logits.argmax(-1)


def make_trainer(args: SFTConfig, preprocess=None):
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    def data(name):
        return load_dataset("json", data_files=str(HERE / name), split="train")

    return SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(HERE / "olmo2"),
        args=args,
        train_dataset=data("train.jsonl"),
        eval_dataset=data("eval.jsonl"),
        processing_class=AutoTokenizer.from_pretrained(HERE / "tokenizer"),
        compute_metrics=_accuracy,
        preprocess_logits_for_metrics=preprocess,
    )


def argmax_trainer(args: SFTConfig):
    return make_trainer(args, _argmax)
"""
FACTORIES = {"logits": "make_trainer", "argmax": "argmax_trainer"}
RECIPE = {
    "output_dir": "runs/mine",
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 2,
    "learning_rate": 1e-4,
    "max_steps": 20,
    "max_length": 128,
    "dataset_text_field": "text",
    "bf16": False,
    "eval_strategy": "steps",
    "eval_steps": 2,
    "save_strategy": "steps",
    "save_steps": 2,
    "per_device_eval_batch_size": 64,
}


def prepare(work: Path) -> None:
    """The tests' tokenizer and training data, the Olmo2-style checkpoint, 128 evaluation
    samples of about 100-128 tokens, the script, the recipe."""
    write_job(work)
    checkpoint(
        work,
        "olmo2",
        "olmo2",
        vocab_size=32000,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
    )
    rng = random.Random(1)
    rows = []
    for _ in range(128):  # byte-level tokens: a word and its space each
        words = [rng.choice(WORDS) for _ in range(40)]
        rows.append(json.dumps({"text": " ".join(words)[: rng.randint(100, 127)]}) + "\n")
    (work / "eval.jsonl").write_text("".join(rows))
    (work / "job.py").write_text(SCRIPT)
    (work / "recipe.json").write_text(json.dumps(RECIPE))


def case(work: Path, variant: str, minutes: str) -> dict[str, Any]:
    study = f"{variant}-{minutes}"
    output = work / f"{study}.best.json"
    storage = f"sqlite:///{work / study}.db"  # a storage each: none takes over another's
    started = time.monotonic()
    done = autotune(
        work,
        *("search", "--trainer", f"job.py:{FACTORIES[variant]}", "--base-args", "recipe.json"),
        *("--memory-budget", BUDGET, "--time-budget", minutes, "--device", "cpu"),
        *("--study", study, "--output", str(output), "--storage", storage),
        stamped=True,
    )
    wall = time.monotonic() - started
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    lines = [line for line in lines if line.split()[1:2] != ["exit"]]  # stamped.py's own
    shown = autotune(work, "show", "--study", study, "--storage", storage, "--format", "json")
    trials = json.loads(shown.stdout)["trials"] if shown.returncode == 0 else []
    result: dict[str, Any] = {
        "variant": variant,
        "time_budget": minutes,
        "wall_s": round(wall, 1),
        "exit": done.returncode,
        "last_line": lines[-1] if lines else "",
        "probes": sum(t["outcome"] != "skipped" for t in trials),
        "exported": output.exists(),
        "said": [line for line in lines if "rehearsal" in line],
    }
    if output.exists():
        exported = json.loads(output.read_text())
        result["eval_batch"] = exported.get("per_device_eval_batch_size")
        fields = {**exported, "max_steps": 4, "output_dir": str(work / "their-run")}
        ran = their_run(work, f"job:{FACTORIES[variant]}", fields, LIMIT)
        result["their_run"] = (
            f"died: {ran['error']}"
            if "error" in ran
            else f"ran: {ran['evaluations']} evaluations, saved {', '.join(ran['saved'])}"
        )
    return result


def measure(args: argparse.Namespace, work: Path) -> Figures:
    prepare(work)
    cases = []
    for variant, minutes in (
        c.split(":") for c in (args.cases or ("argmax:1m" if args.quick else CASES)).split(",")
    ):
        cases.append(case(work, variant, minutes))
        print(json.dumps(cases[-1], indent=2), flush=True)
    return {"budget": BUDGET, "cases": cases}


def report(f: Figures) -> str:
    rows = [
        (
            r["variant"],
            r["time_budget"],
            f"{r['wall_s']:.0f} s",
            r["exit"],
            r["probes"],
            f"eval batch {r['eval_batch']}" if r["exported"] else "none",
            r.get("their_run", ""),
            r["last_line"][:160],
        )
        for r in f["cases"]
    ]
    columns = ("variant", "budget", "wall", "exit", "probes", "export", "their run")
    return (
        header(f, "An evaluating job under short budgets")
        + f"\nMemory {f['budget']}; their run: the user's script with the export, 4 steps, "
        "under the same memory.\n\n" + table((*columns, "last line"), rows)
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", help=f"VARIANT:BUDGET,... ({CASES}; --quick argmax:1m)")


if __name__ == "__main__":
    run(Benchmark("evaluation_job", __doc__, measure, report, options))
