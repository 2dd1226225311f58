#!/usr/bin/env python
"""autotune's export against what users train with today: each trained by a plain
Trainer in the same run, under the same memory budget (RLIMIT_DATA), on this CPU.

- peer: a T5-style seq2seq model, global batch 16, 950 MiB. The plain default
  (fp32, AdamW, no checkpointing) with the largest batch a user finds by halving it,
  accumulation doubled, after each out-of-memory; Trainer's auto_find_batch_size
  (which keeps accumulation); and the export of `autotune search --max-trials 10`.
  Each way's time to a working config and the samples/s of a real run of it.
- minute: a NeoX-style causal LM, 512 tokens, global batch 32, at 2 and 3 GiB.
  `autotune search --time-budget 1m` timed whole, then its export against the plain
  default (8x4) in interleaved rounds (paired ratio, 95% interval). The bars: at least
  4 probes within 63 s, the export at least 0.95x with the global batch kept, a tie
  said where the rounds cannot separate them.

    python benchmarks/vs_default.py                            # 15-20 minutes on 2 cores
    python benchmarks/vs_default.py --jobs minute --rounds 3   # the one-minute search
    python benchmarks/vs_default.py --quick                    # peer's smallest (under 3 min)
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _truth import round_ratio
from harness import (
    CLASSIC,
    Benchmark,
    Figures,
    exported,
    header,
    model_folder,
    run,
    search,
    side_by_side,
    table,
    train,
    trainer_spec,
)

T5 = {
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
DEFAULT = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4}
RUN = ("outcome", "steady_samples_per_s", "samples_per_step", "peak_rss_bytes", "error")
Spec = Callable[..., dict[str, Any]]


def by_hand(work: Path, spec: Spec, global_batch: int) -> Figures:
    """The default with its batch halved (accumulation doubled) until a short run survives."""
    batch, spent, attempts = global_batch, 0.0, 0
    while batch >= 1:
        args: dict[str, Any] = {
            "per_device_train_batch_size": batch,
            "gradient_accumulation_steps": global_batch // batch,
            "optim": "adamw_torch",
        }
        attempts += 1
        tried = train(spec(args, 2), work)
        spent += tried.get("process_wall_s", tried["wall_s"])
        if tried["outcome"] == "ok":
            return {"args": args, "time_to_config_s": spent, "attempts": attempts}
        batch //= 2
    raise SystemExit("nothing fits by hand: raise the budget")


def auto_find(work: Path, spec: Spec, global_batch: int) -> Figures:
    """Trainer's auto_find_batch_size: its time until it trains, the batch it settles on."""
    args = {"per_device_train_batch_size": global_batch, "optim": "adamw_torch"}
    found = train(spec({**args, "auto_find_batch_size": True}, 2), work)
    args["per_device_train_batch_size"] = found.get("per_device_train_batch_size", 0)
    return {
        "args": args,
        "time_to_config_s": found.get("process_wall_s", found["wall_s"]),
        "outcome": found["outcome"],
        "error": found.get("error", ""),
    }


def peer(work: Path, quick: bool) -> Figures:
    s: Figures = {"global_batch": 16, "seq_len": 128, "target_len": 32, "budget_mib": 950}
    s |= {"train_steps": 15, "max_trials": 10}
    if quick:
        s |= {"seq_len": 64, "target_len": 16, "budget_mib": 900, "train_steps": 6}
        s |= {"max_trials": 4}

    def spec(args: dict[str, Any], steps: int = s["train_steps"]) -> dict[str, Any]:
        budget = s["budget_mib"] * 2**20
        return trainer_spec(
            T5, "seq2seq", s["seq_len"], args, steps, budget, target_len=s["target_len"]
        )

    ways = {"default, batch by hand": by_hand(work, spec, s["global_batch"])}
    ways["auto_find_batch_size"] = auto_find(work, spec, s["global_batch"])
    model_folder(work, "bench-t5", T5)
    searched = search(
        work,
        "bench-t5",
        *("--model", "./bench-t5", "--device", "cpu", *CLASSIC, "--quiet"),
        *("--memory-budget", f"{s['budget_mib']}MiB", "--max-trials", str(s["max_trials"])),
        *("--global-batch-size", str(s["global_batch"]), "--seq-len", str(s["seq_len"])),
        *("--target-len", str(s["target_len"])),
    )
    ways["autotune"] = {"args": exported(work, "bench-t5"), "time_to_config_s": searched.wall_s}
    return {**s, "rows": side_by_side_rows(work, ways, spec, 1, "default, batch by hand")}


def minute(work: Path, budget_gib: int, rounds: int, steps: int) -> Figures:
    """One search as a user runs it, then its export against the default in rounds."""
    work = work / f"{budget_gib}g"  # a study storage of its own: no search reuses another's
    study = f"neox-{budget_gib}g"
    model_folder(work, "neox", NEOX)
    searched = search(
        work,
        study,
        *("--model", str(work / "neox"), "--device", "cpu", "--seq-len", "512"),
        *("--global-batch-size", "32", "--memory-budget", f"{budget_gib}GiB"),
        *("--time-budget", "1m"),
    )
    lines = searched.output.splitlines()
    ended = [line.split()[2] for line in lines if re.match(r"trial\s+\d+ \w", line)]
    # the export against the plain default, or, where the default itself is kept, the
    # tie the export says it passed over
    said = ("plain default", "kept your arithmetic")
    export = {
        "args": exported(work, study),
        "time_to_config_s": searched.wall_s,
        "probes": len([outcome for outcome in ended if outcome not in ("running", "skipped")]),
        "headline": next((line.strip() for line in lines if any(s in line for s in said)), ""),
    }
    ways = {"export": export, "default": {"args": DEFAULT, "time_to_config_s": 0.0}}

    def spec(args: dict[str, Any]) -> dict[str, Any]:
        return trainer_spec(NEOX, "causal-lm", 512, args, steps, budget_gib * 2**30)

    return {
        "budget_gib": budget_gib,
        "rows": side_by_side_rows(work, ways, spec, rounds, "default"),
    }


def side_by_side_rows(
    work: Path, ways: dict[str, Figures], spec: Spec, rounds: int, default: str
) -> dict[str, Figures]:
    """Each way that found a config trained side by side with the others in `rounds`
    rounds; its samples/s over the default's, paired round by round (95% interval)."""
    found = {k: w["args"] for k, w in ways.items() if w["args"]["per_device_train_batch_size"]}
    for name, results in side_by_side(work, found, spec, rounds).items():
        ways[name]["runs"] = [{k: r.get(k) for k in RUN} for r in results]
    base = speeds(ways[default])
    for way in ways.values():
        ratio = round_ratio(speeds(way), base) if "runs" in way else (None, None, None)
        way["vs_default"], way["low"], way["high"] = ratio
    return ways


def speeds(way: Figures) -> list[float]:
    return [r["steady_samples_per_s"] or 0.0 for r in way.get("runs", [])]


def measure(args: argparse.Namespace, work: Path) -> Figures:
    figures: Figures = {}
    if "peer" in args.jobs:
        figures["peer"] = peer(work, args.quick)
    if "minute" in args.jobs and not args.quick:
        budgets = [minute(work, budget, args.rounds, args.steps) for budget in (2, 3)]
        figures["minute"] = {"rounds": args.rounds, "steps": args.steps, "budgets": budgets}
    return figures


def report(f: Figures) -> str:
    text = header(f, "autotune's export against the default a user trains with")
    columns = ["way", "config", "time to a working config", "samples/s", "vs default"]
    columns += ["peak RSS", "samples per step", "note"]
    if "peer" in f:
        p = f["peer"]
        text += (
            f"\nPeer: the T5-style model, {p['seq_len']}/{p['target_len']} tokens, global "
            f"batch {p['global_batch']}, {p['budget_mib']} MiB; each config then trains "
            f"{p['train_steps']} steps (steady: after the first two). auto_find_batch_size "
            "keeps accumulation, so it changes the samples per step.\n\n"
        )
        text += table(columns, [row(name, way) for name, way in p["rows"].items()])
    if "minute" in f:
        m = f["minute"]
        text += (
            f"\nMinute: the NeoX-style model, 512 tokens, global batch 32, `--time-budget 1m`; "
            f"the export against the default in {m['rounds']} rounds of {m['steps']} steps "
            "(samples/s: the rounds' mean).\n\n"
        )
        rows = [
            row(f"{b['budget_gib']} GiB, {name}", way)
            for b in m["budgets"]
            for name, way in b["rows"].items()
        ]
        text += table(columns, rows)
    return text


def row(name: str, way: Figures) -> tuple[object, ...]:
    """A way's line: its config, what finding it took, how it trained."""
    runs = way.get("runs") or [{}]
    speed, peak = (
        statistics.fmean(speeds(way) or [0.0]),
        max(r.get("peak_rss_bytes") or 0 for r in runs),
    )
    ratio = "-" if way["vs_default"] is None else f"{way['vs_default']:.3f}"
    if way["vs_default"] is not None and way["low"] != way["high"]:
        ratio += f" ({way['low']:.3f}-{way['high']:.3f})"
    probes = f"{way['probes']} probes; " if "probes" in way else ""
    note = probes + (way.get("headline") or way.get("error") or runs[-1].get("error") or "")
    return (
        name,
        f"`{', '.join(f'{k}={v}' for k, v in way['args'].items())}`",
        f"{way['time_to_config_s']:.0f} s",
        f"{speed:.2f}" if speed else runs[-1].get("outcome", "-"),
        ratio,
        f"{peak / 2**30:.2f} GiB" if peak else "-",
        runs[-1].get("samples_per_step", "-"),
        note[:160],
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", default="peer,minute", help="peer, minute or both")
    parser.add_argument("--rounds", type=int, default=3, help="minute's interleaved rounds")
    parser.add_argument("--steps", type=int, default=6, help="minute's steps a run")


if __name__ == "__main__":
    run(Benchmark("vs_default", __doc__, measure, report, options))
