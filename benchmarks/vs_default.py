#!/usr/bin/env python
"""autotune's config against what users do today, on one small seq2seq model.

Same model, same global batch, same memory budget (RLIMIT_DATA), on this CPU:

(a) the plain default TrainingArguments (fp32, adamw_torch, no checkpointing) with the
    largest per-device batch a careful user finds by hand: start at the global batch,
    halve it (doubling accumulation) after each out-of-memory;
(b) Trainer's own auto_find_batch_size=True (the peer built into transformers), which
    halves the per-device batch on OOM without touching accumulation;
(c) the config `autotune search` exports.

For each: the time to get a working config (failed attempts and search included), and
the steady throughput of that config in a real training run of the same length.
Ratios are to (a). Appends to benchmarks/RESULTS.md and writes vs_default.json.

    python benchmarks/vs_default.py            # a few minutes on 2 cores
    python benchmarks/vs_default.py --quick    # smaller: a check that it runs (under 3 min)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import autotune, machine, save, train

MODEL = {
    "model_type": "t5",
    "architectures": ["T5ForConditionalGeneration"],
    "d_model": 256,
    "d_ff": 1024,
    "d_kv": 64,
    "num_layers": 4,
    "num_heads": 4,
    "vocab_size": 8192,
    "decoder_start_token_id": 0,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "is_encoder_decoder": True,
}


def settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "global_batch": 16,
            "seq_len": 64,
            "target_len": 16,
            "budget_mib": 900,
            "train_steps": 6,
            "max_trials": 4,
        }
    return {
        "global_batch": 16,
        "seq_len": 128,
        "target_len": 32,
        "budget_mib": 950,
        "train_steps": 15,
        "max_trials": 10,
    }


def spec(s: dict[str, Any], args: dict[str, Any], steps: int) -> dict[str, Any]:
    batch = args["per_device_train_batch_size"] * args.get("gradient_accumulation_steps", 1)
    return {
        "model": MODEL,
        "task": "seq2seq",
        "seq_len": s["seq_len"],
        "target_len": s["target_len"],
        "budget_bytes": s["budget_mib"] * 2**20,
        "num_samples": batch * (steps + 2),
        "args": {
            "output_dir": "out",
            "report_to": "none",
            "save_strategy": "no",
            "max_steps": steps,
            "disable_tqdm": True,
            "use_cpu": True,
            **args,
        },
    }


def by_hand(s: dict[str, Any], work: Path) -> tuple[dict[str, Any], float, int]:
    """Halve the batch until a short run survives; returns (args, seconds, attempts)."""
    batch, spent, attempts = s["global_batch"], 0.0, 0
    while batch >= 1:
        args = {
            "per_device_train_batch_size": batch,
            "gradient_accumulation_steps": s["global_batch"] // batch,
            "optim": "adamw_torch",
        }
        attempts += 1
        result = train(spec(s, args, 2), work)
        spent += result.get("process_wall_s", result["wall_s"])
        if result["outcome"] == "ok":
            return args, spent, attempts
        batch //= 2
    raise SystemExit("nothing fits by hand: raise the budget")


def peer(s: dict[str, Any], work: Path) -> tuple[dict[str, Any], float, dict[str, Any]]:
    """auto_find_batch_size: time until it trains, and the batch it settles on."""
    args = {
        "per_device_train_batch_size": s["global_batch"],
        "optim": "adamw_torch",
        "auto_find_batch_size": True,
    }
    result = train(spec(s, args, 2), work)
    found = {
        "per_device_train_batch_size": result.get("per_device_train_batch_size", 0),
        "optim": "adamw_torch",
    }
    return found, result.get("process_wall_s", result["wall_s"]), result


def ours(s: dict[str, Any], work: Path) -> tuple[dict[str, Any], float]:
    model = work / "bench-t5"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL))
    started = time.monotonic()
    done = autotune(
        work,
        "search",
        "--model",
        str(model),
        "--device",
        "cpu",
        # the classic five only: benchmarks/levers.py measures compilation and attention
        "--lever",
        "torch_compile=false",
        "--lever",
        "attn_implementation=sdpa",
        "--memory-budget",
        f"{s['budget_mib']}MiB",
        "--global-batch-size",
        str(s["global_batch"]),
        "--seq-len",
        str(s["seq_len"]),
        "--target-len",
        str(s["target_len"]),
        "--max-trials",
        str(s["max_trials"]),
        "--quiet",
    )
    if done.returncode != 0:
        raise SystemExit(f"autotune search failed: {done.stderr[-500:]}")
    args = json.loads((work / "studies" / "bench-t5.best.json").read_text())
    args.pop("use_cpu", None)
    return args, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--budget-mib", type=int, help="another memory budget than the default")
    options = parser.parse_args()
    s = settings(options.quick)
    if options.budget_mib:
        s["budget_mib"] = options.budget_mib
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows: dict[str, dict[str, Any]] = {}
        hand_args, hand_s, attempts = by_hand(s, work)
        rows["default, batch by hand"] = {
            "args": hand_args,
            "time_to_config_s": hand_s,
            "attempts": attempts,
        }
        peer_args, peer_s, peer_raw = peer(s, work)
        rows["auto_find_batch_size"] = {
            "args": peer_args,
            "time_to_config_s": peer_s,
            "outcome": peer_raw["outcome"],
            "error": peer_raw.get("error", ""),
        }
        tuned_args, tuned_s = ours(s, work)
        rows["autotune"] = {"args": tuned_args, "time_to_config_s": tuned_s}
        for row in rows.values():
            if row["args"].get("per_device_train_batch_size"):
                run = train(spec(s, row["args"], s["train_steps"]), work)
                row["run"] = {
                    k: run.get(k)
                    for k in (
                        "outcome",
                        "steady_samples_per_s",
                        "samples_per_step",
                        "peak_rss_bytes",
                        "error",
                    )
                }
    base = rows["default, batch by hand"]["run"]["steady_samples_per_s"] or 0.0
    for row in rows.values():
        sps = (row.get("run") or {}).get("steady_samples_per_s") or 0.0
        row["throughput_vs_default"] = round(sps / base, 3) if base else None
    flags = (" --quick" if options.quick else "") + (
        f" --budget-mib {options.budget_mib}" if options.budget_mib else ""
    )
    figures = {**machine(), **s, "quick": options.quick, "flags": flags, "rows": rows}
    name = f"vs_default_{options.budget_mib}mib" if options.budget_mib else "vs_default"
    save(name, figures, markdown(figures), not options.no_append)


def markdown(f: dict[str, Any]) -> str:
    lines = []
    for name, row in f["rows"].items():
        run = row.get("run") or {}
        sps = run.get("steady_samples_per_s")
        peak = run.get("peak_rss_bytes")
        args = ", ".join(f"{k}={v}" for k, v in row["args"].items())
        note = row.get("error") or run.get("error") or ""
        lines.append(
            f"| {name} | `{args}` | {row['time_to_config_s']:.0f} s | "
            f"{f'{sps:.2f}' if sps else run.get('outcome', '-')} | "
            f"{row['throughput_vs_default'] if row['throughput_vs_default'] is not None else '-'} | "
            f"{f'{peak / 2**30:.2f} GiB' if peak else '-'} | {run.get('samples_per_step', '-')} | {note[:80]} |"
        )
    table = "\n".join(lines)
    return f"""
## autotune against the default and auto_find_batch_size ({f["date"]}{", quick" if f["quick"] else ""})

Machine: {f["machine"]}; {f["versions"]}. Command: `python benchmarks/vs_default.py{f["flags"]}`.
A T5-style seq2seq model (d_model 256, 4+4 layers, vocab 8192) from its config, {f["seq_len"]}/{f["target_len"]} tokens,
global batch {f["global_batch"]}, memory budget {f["budget_mib"]} MiB enforced with RLIMIT_DATA; each config then trains
{f["train_steps"]} optimizer steps in a real Trainer run (steady samples/s: the steps after the first two).

| way | config | time to a working config | samples/s | vs default | peak RSS | samples per step | note |
| --- | --- | --- | --- | --- | --- | --- | --- |
{table}

auto_find_batch_size halves the per-device batch without raising accumulation, so the
samples per optimizer step (the recipe) change; autotune and the by-hand default keep
the global batch.
"""


if __name__ == "__main__":
    main()
