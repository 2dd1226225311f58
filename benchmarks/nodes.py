#!/usr/bin/env python
"""The same search as 1 node x 2 processes and as 2 nodes x 1 process (CPU, gloo).

Two "nodes" are two `autotune search` processes on this machine (--nnodes 2, each its
own --node-rank, torchrun's c10d rendezvous on loopback, a journal file as the shared
storage). The same space, --max-trials and seed each way, in interleaved rounds (1 node,
2 nodes, then the other order): the wall of the whole search, its probes, the wall per
probe, and each config's samples/s both ways. What it prices is the search's overhead
per probe across nodes (the announcement through the storage, the rendezvous, the
results gathered back), not a network: both nodes share this machine's two cores, one
each (OMP_NUM_THREADS=1, as torchrun sets for each of one node's two processes). The
classic five only: ZeRO stays off (`--lever zero_stage=0`), so both ways probe alike.

    python benchmarks/nodes.py              # about 5 minutes on 2 cores
    python benchmarks/nodes.py --rounds 1   # one search each way
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import autotune, machine, save
from scaleout import MODEL  # the same small GPT-2 as the workers' scale-out

TRIALS = 4


def argv(study: str, storage: Path) -> list[str]:
    return [
        "search",
        "--model",
        "./bench-gpt2",
        "--device",
        "cpu",
        "--study",
        study,
        "--storage",
        str(storage),
        "--no-reuse",
        "--no-rehearse",
        "--parity",
        "off",
        "--confirm-top",
        "0",
        "--lever",
        "torch_compile=false",
        "--lever",
        "attn_implementation=sdpa",
        "--lever",
        "zero_stage=0",
        "--global-batch-size",
        "32",
        "--seq-len",
        "128",
        "--precisions",
        "fp32",
        "--optimizers",
        "adamw_torch,adafactor",
        "--checkpointing",
        "off",
        "--max-trials",
        str(TRIALS),
        "--warmup-steps",
        "2",
        "--measure-steps",
        "3",
        "--fixed-steps",
        "--quiet",
    ]


def one_node(work: Path, study: str) -> float:
    started = time.monotonic()
    done = autotune(work, *argv(study, work / "one.log"), "--nproc-per-node", "2")
    if done.returncode != 0:
        raise SystemExit(f"1 node x 2 failed: {done.stderr[-800:]}")
    return time.monotonic() - started


def two_nodes(work: Path, study: str) -> float:
    base = [sys.executable, "-m", "autotune", *argv(study, work / "two.log")]
    base += ["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1"]
    # a node's one process takes one core, as torchrun gives each of one node's two
    # (OMP_NUM_THREADS=1): on separate machines the nodes would not share cores
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    follower = subprocess.Popen(
        [*base, "--node-rank", "1"],
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    head = subprocess.run(
        [*base, "--node-rank", "0"], cwd=work, env=env, capture_output=True, text=True
    )
    wall = time.monotonic() - started
    _, err = follower.communicate(timeout=120)
    if head.returncode != 0 or follower.returncode != 0:
        raise SystemExit(f"2 nodes x 1 failed: {head.stderr[-800:]} {err[-400:]}")
    return wall


def figures(work: Path, study: str, storage: str, wall: float) -> dict[str, Any]:
    shown = autotune(work, "show", "--study", study, "--storage", storage, "--format", "json")
    trials = [t for t in json.loads(shown.stdout)["trials"] if t["outcome"] == "ok"]
    return {
        "wall_s": round(wall, 1),
        "probes": len(trials),
        "per_probe_s": round(wall / max(1, len(trials)), 1),
        "samples_per_s": {t["config"]: t["samples_per_s"] for t in trials},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-append", action="store_true")
    options = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"1x2": [], "2x1": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "bench-gpt2").mkdir()
        (work / "bench-gpt2" / "config.json").write_text(json.dumps(MODEL))
        for r in range(options.rounds):
            order = ("1x2", "2x1") if r % 2 == 0 else ("2x1", "1x2")
            for way in order:
                study = f"{way}-{r}"
                if way == "1x2":
                    wall, storage = one_node(work, study), str(work / "one.log")
                else:
                    wall, storage = two_nodes(work, study), str(work / "two.log")
                runs[way].append(figures(work, study, storage, wall))
                print(way, runs[way][-1], flush=True)
    per_probe = {w: statistics.mean(r["per_probe_s"] for r in rs) for w, rs in runs.items()}
    result = {
        **machine(),
        "rounds": options.rounds,
        "runs": runs,
        "overhead_per_probe_s": round(per_probe["2x1"] - per_probe["1x2"], 1),
    }
    save("nodes", result, markdown(result), not options.no_append)


def markdown(f: dict[str, Any]) -> str:
    rows = []
    for way, label in (("1x2", "1 node x 2 processes"), ("2x1", "2 nodes x 1 process")):
        for r in f["runs"][way]:
            speeds = ", ".join(f"{c}: {s:.1f}" for c, s in sorted(r["samples_per_s"].items()))
            rows.append(
                f"| {label} | {r['wall_s']:.0f} s | {r['probes']} | {r['per_probe_s']:.1f} s "
                f"| {speeds} |"
            )
    return f"""
## One search as 1 node x 2 processes and as 2 nodes x 1 process ({f["date"]})

Machine: {f["machine"]}; {f["versions"]}. Command: `python benchmarks/nodes.py`, alone.
A GPT-2-style model (n_embd 128, 2 layers), 128 tokens, global batch 32, fp32, AdamW and
Adafactor, no checkpointing, no ZeRO, {TRIALS} probes of 2 warm-up and 3 timed steps, no
confirmation, parity or rehearsal; {f["rounds"]} interleaved rounds. Two nodes are two
`autotune search` processes on this machine (gloo on loopback, a journal file shared).

| layout | wall | probes | wall per probe | samples/s per config |
| --- | --- | --- | --- | --- |
{chr(10).join(rows)}

Across nodes each probe costs {f["overhead_per_probe_s"]:+.1f} s more than on one node (the
announcement through the storage, the c10d rendezvous, the results gathered back).
"""


if __name__ == "__main__":
    main()
