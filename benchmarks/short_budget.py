#!/usr/bin/env python
"""A one-minute search, checked against a plain Trainer in the same run.

The short-budget case: a NeoX-style causal LM (4 layers, 256 wide, vocab 8192), 512
tokens, a global batch of 32, on this CPU, at two memory budgets. For each budget:

1. `autotune search --time-budget 1m`, timed whole: its wall time, the probes it ran,
   and its headline (the exported config against the plain default, or a tie);
2. the exported config and the plain default (8 x 4, fp32, AdamW, no checkpointing),
   each trained by a plain Trainer in its own process under the same budget
   (RLIMIT_DATA), in interleaved rounds (odd rounds reversed): the export's steady
   samples/s over the default's, paired round by round, with a 95% interval.

The bars it reports: at least 4 probes, within 63 s, the export at least 0.95x the
default with the global batch kept, and a tie said where the rounds cannot separate them.

    python benchmarks/short_budget.py [--rounds 3] [--steps 6] [--no-append]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import autotune, machine, save, train
from _truth import round_ratio

NEOX = {
    "model_type": "gpt_neox",
    "architectures": ["GPTNeoXForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "vocab_size": 8192,
    "max_position_embeddings": 2048,
}
SEQ_LEN = 512
GLOBAL_BATCH = 32
BUDGETS_GIB = (2, 3)
DEFAULT = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4}


def search(work: Path, budget_gib: int) -> dict[str, Any]:
    """One search as a user runs it; its wall time, probes, headline and export."""
    study = f"neox-{budget_gib}g"
    started = time.monotonic()
    done = autotune(
        work,
        "search",
        "--model",
        str(work / "neox"),
        "--device",
        "cpu",
        "--seq-len",
        str(SEQ_LEN),
        "--global-batch-size",
        str(GLOBAL_BATCH),
        "--memory-budget",
        f"{budget_gib}GiB",
        "--time-budget",
        "1m",
        "--study",
        study,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"search failed: {done.stderr[-800:]}")
    lines = done.stdout.splitlines()
    ended = [line.split()[2] for line in lines if re.match(r"trial\s+\d+ \w", line)]
    probes = len([outcome for outcome in ended if outcome not in ("running", "skipped")])
    # the export against the plain default, or, where the default itself is kept, the
    # tie the export says it passed over
    said = ("plain default", "kept your arithmetic")
    headline = next((line for line in lines if any(s in line for s in said)), "")
    export = json.loads((work / "studies" / f"{study}.best.json").read_text())
    return {
        "wall_s": round(wall, 1),
        "probes": probes,
        "headline": headline.strip(),
        "export": export,
    }


def run_spec(args: dict[str, Any], budget_gib: int, steps: int) -> dict[str, Any]:
    batch = args["per_device_train_batch_size"] * args.get("gradient_accumulation_steps", 1)
    fields = {k: v for k, v in args.items() if k not in ("output_dir", "use_cpu")}
    return {
        "model": NEOX,
        "task": "causal-lm",
        "seq_len": SEQ_LEN,
        "target_len": 0,
        "budget_bytes": budget_gib * 2**30,
        "num_samples": batch * (steps + 2),
        "args": {
            "output_dir": "out",
            "report_to": "none",
            "save_strategy": "no",
            "disable_tqdm": True,
            "use_cpu": True,
            **fields,
            "max_steps": steps,
        },
    }


def compare(
    work: Path, export: dict[str, Any], budget_gib: int, rounds: int, steps: int
) -> dict[str, Any]:
    runs: dict[str, list[float]] = {"export": [], "default": []}
    peaks: dict[str, int] = {}
    order = [("export", export), ("default", DEFAULT)]
    for number in range(rounds):
        for name, args in order if number % 2 == 0 else order[::-1]:
            result = train(run_spec(args, budget_gib, steps), work)
            runs[name].append(result.get("steady_samples_per_s") or 0.0)
            peaks[name] = max(peaks.get(name, 0), result.get("peak_rss_bytes") or 0)
            print(
                f"  {budget_gib} GiB round {number + 1} {name}: {runs[name][-1]:.2f} samples/s "
                f"({result.get('outcome')})",
                flush=True,
            )
    ratio, low, high = round_ratio(runs["export"], runs["default"])
    return {"runs": runs, "peaks": peaks, "ratio": ratio, "low": low, "high": high}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--no-append", dest="append", action="store_false")
    options = parser.parse_args()
    rows = []
    for budget in BUDGETS_GIB:
        # a folder (and a study storage) of its own: no search reuses another's probes
        work = Path(tempfile.mkdtemp(prefix=f"autotune-short-{budget}g-"))
        (work / "neox").mkdir()
        (work / "neox" / "config.json").write_text(json.dumps(NEOX))
        found = search(work, budget)
        print(f"{budget} GiB: {found['probes']} probes in {found['wall_s']} s; {found['headline']}")
        export = found["export"]
        kept = export["per_device_train_batch_size"] * export.get("gradient_accumulation_steps", 1)
        measured = compare(work, export, budget, options.rounds, options.steps)
        rows.append({"budget_gib": budget, **found, "global_batch": kept, **measured})
    figures = {**machine(), "rows": rows}
    save("short_budget", figures, markdown(figures), options.append)


def described(args: dict[str, Any]) -> str:
    precision = "bf16" if args.get("bf16") else "fp16" if args.get("fp16") else "fp32"
    ckpt = "ckpt" if args.get("activation_checkpointing") else "no-ckpt"
    return (
        f"{args['per_device_train_batch_size']}x{args.get('gradient_accumulation_steps', 1)} "
        f"{precision} {ckpt} {args.get('optim', 'adamw_torch')}"
    )


def markdown(figures: dict[str, Any]) -> str:
    lines = [
        f"\n## A one-minute search against a plain Trainer ({figures['date']}, "
        f"{figures['machine']})\n",
        "`benchmarks/short_budget.py`: a NeoX-style causal LM (4 layers, 256 wide, vocab "
        "8192), 512 tokens, global batch 32, `autotune search --time-budget 1m`, then its "
        "export and the plain default (8x4 fp32 AdamW) trained by a plain Trainer under the "
        "same budget in interleaved rounds (ratio: paired geometric mean, 95% interval).\n",
        "| budget | search wall | probes | exported | global batch | export / default | headline |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in figures["rows"]:
        lines.append(
            f"| {row['budget_gib']} GiB | {row['wall_s']} s | {row['probes']} | "
            f"{described(row['export'])} | {row['global_batch']} | {row['ratio']:.3f}x "
            f"({row['low']:.3f}-{row['high']:.3f}) | {row['headline'][:160]} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
