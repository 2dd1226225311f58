#!/usr/bin/env python
"""Checks first, measured: a job that evaluates and saves, searched under short budgets,
then the user's own script run with what was exported, under the same memory.

The job (no test builds it): an `SFTTrainer` full fine-tune of a small Olmo2-style model
(32k vocabulary, untied head, ~20M parameters), 128 evaluation samples of up to 128
tokens, `per_device_eval_batch_size` 64, a `compute_metrics` that keeps the logits (so
the Trainer holds every evaluation batch's 128 x 32k fp32 scores to the end of the pass),
an evaluation and a checkpoint every 2 steps, 2 GiB. Its variants:

- `logits`: as above. No evaluation batch fits: the kept logits pile up past the budget
  whatever the batch, and no training config changes that.
- `argmax`: `preprocess_logits_for_metrics` takes the argmax first, so only one batch's
  logits are held: a smaller evaluation batch fits.

For each case (a variant at a time budget): the search's wall time, exit status and last
line, whether it wrote an export, and, where it did, whether the user's script, reading
the export with HfArgumentParser, trains 4 steps with its evaluations and saves under
the same 2 GiB (RLIMIT_DATA, set after the imports).

    python benchmarks/evaluation_job.py [--no-append] [--cases logits:3m,argmax:3m,logits:6m]
    python benchmarks/evaluation_job.py --code /path/to/older/checkout --no-append  # before
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from _common import ROOT, autotune, machine, save

sys.path.insert(0, str(ROOT / "tests"))
from job_script import WORDS, write_job  # the tests' tokenizer and training data

BUDGET = "2GiB"
LIMIT = 2 * 2**30  # the user's run: the same 2 GiB
EVAL_SAMPLES = 128
CASES = "logits:3m,argmax:3m,logits:6m"

SCRIPT = """
import os
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


def make_trainer(args: SFTConfig):
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
        preprocess_logits_for_metrics=_argmax if os.environ.get("JOB_ARGMAX") else None,
    )
"""

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


def prepare(work: Path) -> Path:
    """The tests' tokenizer and training data, an Olmo2-style checkpoint with a 32k
    vocabulary, 128 evaluation samples of about 100-128 tokens, the script, the recipe."""
    import random

    from transformers import AutoTokenizer, Olmo2Config, Olmo2ForCausalLM

    write_job(work)
    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    config = Olmo2Config(
        vocab_size=32000,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    Olmo2ForCausalLM(config).save_pretrained(work / "olmo2")
    rng = random.Random(1)
    rows = []
    for _ in range(EVAL_SAMPLES):  # byte-level tokens: a word and its space each
        words = [rng.choice(WORDS) for _ in range(40)]
        rows.append(json.dumps({"text": " ".join(words)[: rng.randint(100, 127)]}) + "\n")
    (work / "eval.jsonl").write_text("".join(rows))
    (work / "job.py").write_text(SCRIPT)
    (work / "recipe.json").write_text(json.dumps(RECIPE))
    return work


def run_case(work: Path, variant: str, minutes: str, env: dict[str, str]) -> dict[str, Any]:
    study = f"{variant}-{minutes}"
    output = work / f"{study}.best.json"
    started = time.monotonic()
    search = [
        *("search", "--trainer", "job.py:make_trainer", "--base-args", "recipe.json"),
        *("--memory-budget", BUDGET, "--time-budget", minutes, "--device", "cpu"),
        *("--study", study, "--output", str(output)),
        # a storage each: no case takes over what another measured
        *("--storage", f"sqlite:///{work / study}.db"),
    ]
    stamped = [sys.executable, str(ROOT / "benchmarks" / "stamped.py")]
    done = subprocess.run(
        [*stamped, sys.executable, "-m", "autotune", *search],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    wall = time.monotonic() - started
    (work / f"{study}.search.log").write_text(done.stdout + done.stderr)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    lines = [line for line in lines if line.split()[1:2] != ["exit"]]  # stamped.py's own
    storage = f"sqlite:///{work / study}.db"
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
        result["their_run"] = their_run(work, output, env)
    return result


def their_run(work: Path, exported: Path, env: dict[str, str]) -> str:
    """The user's script with the export: 4 steps, an evaluation and a save every 2,
    under the search's memory budget; what it did, or the error it died of."""
    code = textwrap.dedent(
        f"""
        import json, os, resource, sys
        sys.path.insert(0, {str(work)!r})
        from transformers import HfArgumentParser
        from trl import SFTConfig
        import job
        (args,) = HfArgumentParser(SFTConfig).parse_json_file({str(exported)!r})
        args.max_steps, args.output_dir = 4, {str(work / "their-run")!r}
        resource.setrlimit(resource.RLIMIT_DATA, ({LIMIT}, {LIMIT}))
        trainer = job.make_trainer(args)
        trainer.train()
        evaluations = sum("eval_loss" in h for h in trainer.state.log_history)
        saved = sorted(n for n in os.listdir(args.output_dir) if n.startswith("checkpoint-"))
        print(f"ran: {{evaluations}} evaluations, saved {{', '.join(saved)}}")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=work, capture_output=True, text=True, env=env
    )
    if done.returncode == 0:
        return done.stdout.strip().splitlines()[-1]
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    return "died: " + (errors[-1] if errors else f"exit {done.returncode}")[:200]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--cases", default=CASES, help=f"VARIANT:BUDGET,... (default {CASES})")
    parser.add_argument("--code", help="an autotune checkout to run instead of this one")
    options = parser.parse_args()
    cases = [tuple(c.split(":")) for c in options.cases.split(",")]
    work = prepare(Path(tempfile.mkdtemp(prefix="autotune-evaluation-")))
    base = {**os.environ, "HF_HUB_OFFLINE": "1", "ARROW_DEFAULT_MEMORY_POOL": "system"}
    if options.code:
        base["PYTHONPATH"] = str(Path(options.code).resolve())
    code = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=options.code or ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    results = []
    for variant, minutes in cases:
        env = {**base, **({"JOB_ARGMAX": "1"} if variant == "argmax" else {})}
        results.append(run_case(work, variant, minutes, env))
        print(json.dumps(results[-1], indent=2), flush=True)
    figures = {**machine(), "code": code, "budget": BUDGET, "cases": results}
    save("evaluation_job", figures, _markdown(figures), append=not options.no_append)


def _markdown(figures: dict[str, Any]) -> str:
    rows = []
    for r in figures["cases"]:
        export = f"eval batch {r['eval_batch']}" if r["exported"] else "none"
        run = r.get("their_run", "")
        rows.append(
            f"| {r['variant']} | {r['time_budget']} | {r['wall_s']:.0f} s | {r['exit']} | "
            f"{r['probes']} | {export} | {run} | {r['last_line'][:160]} |"
        )
    return (
        f"\n## An evaluating job under short budgets ({figures['date']}, {figures['machine']}, "
        f"code {figures['code']})\n\n"
        "`python benchmarks/evaluation_job.py`: an SFTTrainer full fine-tune of an "
        "Olmo2-style model (32k vocabulary), 128 evaluation samples, evaluation batch 64, "
        "metrics that keep the logits (`argmax`: an argmax first), an evaluation and a "
        f"save every 2 steps, {figures['budget']}; their run: the user's script with the "
        "export, 4 steps, under the same memory.\n\n"
        "| variant | budget | wall | exit | probes | export | their run | last line |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
    )


if __name__ == "__main__":
    main()
