#!/usr/bin/env python
"""Search wall time with 1 worker against 2 workers on one study (CPU, small model).

The same search (same space, same --max-trials, same seed) runs twice in fresh
studies: once with one worker on all cores, once with `--parallel 2` (two workers
on one study, one core each; the finalists are then re-measured alone). Reports
both wall times, their ratio, the probes each ran, and the config each selected
with its throughput measured alone. Appends to RESULTS.md.

    python benchmarks/scaleout.py            # a few minutes on 2 cores
    python benchmarks/scaleout.py --quick    # smaller, for the CI smoke test
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import autotune, machine, save

MODEL = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_embd": 128,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 256,
    "vocab_size": 4096,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def settings(quick: bool) -> dict[str, Any]:
    if quick:
        # the smoke run checks the script end to end; parity runs, the same for one worker
        # and two, have their own tests (tests/tuning/test_parity_search.py)
        return {
            "max_trials": 4,
            "global_batch": 16,
            "seq_len": 64,
            "confirm_top": 1,
            "parity": "off",
        }
    return {"max_trials": 12, "global_batch": 32, "seq_len": 128, "confirm_top": 2, "parity": "on"}


def search(work: Path, s: dict[str, Any], study: str, parallel: int) -> dict[str, Any]:
    started = time.monotonic()
    done = autotune(
        work,
        "search",
        "--model",
        "./bench-gpt2",
        "--device",
        "cpu",
        # the classic five only: benchmarks/levers.py measures compilation and attention
        "--lever",
        "torch_compile=false",
        "--lever",
        "attn_implementation=sdpa",
        "--study",
        study,
        "--global-batch-size",
        str(s["global_batch"]),
        "--seq-len",
        str(s["seq_len"]),
        "--precisions",
        "fp32,bf16",
        "--optimizers",
        "adamw_torch,adafactor,adamw_bnb_8bit",
        "--max-trials",
        str(s["max_trials"]),
        "--confirm-top",
        str(s["confirm_top"]),
        "--parity",
        s["parity"],
        "--parallel",
        str(parallel),
        "--quiet",
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"autotune search --parallel {parallel} failed: {done.stderr[-800:]}")
    shown = json.loads(autotune(work, "show", "--study", study, "--format", "json").stdout)
    best = next(t for t in shown["trials"] if t["best"])
    probes = [t for t in shown["trials"] if t["outcome"] != "skipped"]
    return {
        "wall_s": round(wall, 1),
        "probes": len(probes),
        "best": best["config"],
        "best_samples_per_s": best["samples_per_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-append", action="store_true")
    options = parser.parse_args()
    s = settings(options.quick)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "bench-gpt2").mkdir()
        (work / "bench-gpt2" / "config.json").write_text(json.dumps(MODEL))
        one = search(work, s, "one-worker", 1)
        two = search(work, s, "two-workers", 2)
    figures = {
        **machine(),
        **s,
        "quick": options.quick,
        "one_worker": one,
        "two_workers": two,
        "wall_ratio": round(one["wall_s"] / two["wall_s"], 2),
    }
    save("scaleout", figures, markdown(figures), not options.no_append)


def markdown(f: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| {name} | {r['wall_s']:.0f} s | {r['probes']} | {r['best']} | "
        f"{r['best_samples_per_s']:.2f} |"
        for name, r in (
            ("1 worker", f["one_worker"]),
            ("2 workers (--parallel 2)", f["two_workers"]),
        )
    )
    return f"""
## Scale-out: 1 worker against 2 workers on one study ({f["date"]}{", quick" if f["quick"] else ""})

Machine: {f["machine"]}; {f["versions"]}. Command: `python benchmarks/scaleout.py{" --quick" if f["quick"] else ""}`.
A GPT-2-style model (n_embd 128, 2 layers), {f["seq_len"]} tokens, global batch {f["global_batch"]},
precisions fp32/bf16, optimizers adamw_torch/adafactor/adamw_bnb_8bit, --max-trials {f["max_trials"]},
--confirm-top {f["confirm_top"]}. Wall: the whole `autotune search` command, confirmation included.

| search | wall | probes | selected | selected samples/s (alone) |
| --- | --- | --- | --- | --- |
{rows}

1 worker / 2 workers wall time: **{f["wall_ratio"]}x**.
"""


if __name__ == "__main__":
    main()
