#!/usr/bin/env python
"""The single-GPU guide's table, redone on this CPU through autotune's probe.

The Hugging Face guide measured bert-large on a V100: vanilla 8.86 samples/s at
14.9 GB, fp16 18.64 at 13.9 GB, gradient checkpointing about 20% slower, Adafactor
and 8-bit Adam saving optimizer memory. Here a scaled-down BERT classifier runs the
same rows (and bf16) through the same probe `autotune search` uses, and each of the
guide's findings is checked against the figures. Appends to RESULTS.md.

    python benchmarks/seed_table.py            # a few minutes on 2 cores
    python benchmarks/seed_table.py --quick    # smaller, for the CI smoke test
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from _common import machine, save

from autotune.core.trial import Candidate, TrialConfig
from autotune.hf.models import resolve_model
from autotune.launch.forkserver import ForkServer
from autotune.launch.runner import run_trial

BERT = {
    "model_type": "bert",
    "architectures": ["BertForSequenceClassification"],
    "hidden_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "intermediate_size": 2048,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
    "num_labels": 2,
}
ROWS = {
    "vanilla (fp32, adamw_torch)": ("fp32", False, "adamw_torch"),
    "fp16": ("fp16", False, "adamw_torch"),
    "bf16": ("bf16", False, "adamw_torch"),
    "gradient checkpointing": ("fp32", True, "adamw_torch"),
    "adafactor": ("fp32", False, "adafactor"),
    "8-bit adam": ("fp32", False, "adamw_bnb_8bit"),
}
BUDGET = 16 * 2**30


def settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {"batch": 8, "seq_len": 64, "steps": (1, 2), "hidden": 128, "layers": 2}
    return {"batch": 16, "seq_len": 256, "steps": (2, 6), "hidden": 512, "layers": 6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-append", action="store_true")
    options = parser.parse_args()
    s = settings(options.quick)
    config = {
        **BERT,
        "hidden_size": s["hidden"],
        "num_hidden_layers": s["layers"],
        "intermediate_size": 4 * s["hidden"],
    }
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "bert").mkdir()
        (work / "bert" / "config.json").write_text(json.dumps(config))
        model = resolve_model(str(work / "bert"))
        server = ForkServer(work / "server.log", data_limit=BUDGET)
        try:
            for n, (name, (precision, ckpt, optim)) in enumerate(ROWS.items()):
                trial = TrialConfig(
                    number=n,
                    trial_dir=str(work / str(n)),
                    model=model,
                    candidate=Candidate(s["batch"], 1, precision, ckpt, optim),
                    device="cpu",
                    seq_len=s["seq_len"],
                    target_len=8,
                    memory_limit_bytes=BUDGET,
                    warmup_steps=s["steps"][0],
                    measure_steps=s["steps"][1],
                )
                r = run_trial(trial, timeout_s=900, server=server)
                rows[name] = {
                    "outcome": r.outcome.value,
                    "samples_per_s": r.samples_per_s,
                    "peak_bytes": r.peak_memory_bytes,
                    "spread": r.step_time_spread,
                    "reason": r.reason,
                }
        finally:
            server.close()
    figures = {**machine(), **s, "quick": options.quick, "rows": rows, "findings": findings(rows)}
    save("seed_table", figures, markdown(figures), not options.no_append)


def findings(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    def sps(name: str) -> float:
        return float(rows[name]["samples_per_s"] or 0.0)

    def peak(name: str) -> float:
        return float(rows[name]["peak_bytes"] or 0)

    v = "vanilla (fp32, adamw_torch)"

    def saves(name: str) -> bool:  # by more than the 1% the peak varies between runs
        return peak(name) < 0.99 * peak(v)

    checks = [
        (
            "fp16 is faster than vanilla (guide: 2.1x)",
            sps("fp16") > sps(v),
            f"{sps('fp16') / sps(v):.2f}x",
        ),
        (
            "fp16 uses less memory than vanilla (guide: 13.9 vs 14.9 GB)",
            saves("fp16"),
            f"{peak('fp16') / peak(v):.2f}x the peak",
        ),
        (
            "gradient checkpointing is about 20% slower",
            0.6 < sps("gradient checkpointing") / sps(v) < 0.95,
            f"{1 - sps('gradient checkpointing') / sps(v):+.0%} slower",
        ),
        (
            "gradient checkpointing saves memory",
            saves("gradient checkpointing"),
            f"{peak('gradient checkpointing') / peak(v):.2f}x the peak",
        ),
        (
            "Adafactor saves optimizer memory",
            saves("adafactor"),
            f"{(peak(v) - peak('adafactor')) / 2**20:.0f} MiB less",
        ),
        (
            "8-bit Adam saves optimizer memory",
            saves("8-bit adam"),
            f"{(peak(v) - peak('8-bit adam')) / 2**20:.0f} MiB less",
        ),
    ]
    return [{"finding": f, "holds here": bool(ok), "figure": fig} for f, ok, fig in checks]


def markdown(f: dict[str, Any]) -> str:
    table = "\n".join(
        f"| {name} | {r['samples_per_s'] or 0:.2f} | {(r['peak_bytes'] or 0) / 2**30:.2f} GiB | "
        f"±{100 * (r['spread'] or 0):.0f}% | {r['outcome']} |"
        for name, r in f["rows"].items()
    )
    found = "\n".join(
        f"| {x['finding']} | {'yes' if x['holds here'] else 'no'} | {x['figure']} |"
        for x in f["findings"]
    )
    return f"""
## The guide's bert-large table, redone on this CPU ({f["date"]}{", quick" if f["quick"] else ""})

Machine: {f["machine"]}; {f["versions"]}. Command: `python benchmarks/seed_table.py{" --quick" if f["quick"] else ""}`.
A BERT classifier from its config (hidden {f["hidden"]}, {f["layers"]} layers, vocab 30522), batch {f["batch"]},
{f["seq_len"]} tokens, through autotune's probe (warm-up {f["steps"][0]}, measured {f["steps"][1]} optimizer steps).

| row | samples/s | peak RSS | step spread | outcome |
| --- | --- | --- | --- | --- |
{table}

| the guide's finding (V100) | holds on this CPU? | figure here |
| --- | --- | --- |
{found}
"""


if __name__ == "__main__":
    main()
