#!/usr/bin/env python
"""One search spread four ways on this machine's CPU: what spreading it costs or gains.

The same search (a GPT-2-style model, 128 wide, 2 layers; the same space, --max-trials
and seed) as:

- workers: 1 worker on all cores against `--parallel 2` (two workers on one study, one
  core each; the finalists then re-measured alone): the whole command's wall, its
  probes, and the config each selected with its samples/s measured alone;
- nodes: 1 node x 2 processes against 2 nodes x 1 process (two `autotune search`
  processes, --nnodes 2, torchrun's c10d rendezvous on loopback, a journal file as the
  shared storage), in interleaved rounds: the wall per probe and each config's samples/s
  both ways. What it prices is the search's overhead per probe across nodes (the
  announcement through the storage, the rendezvous, the results gathered back), not a
  network: each node gets one core (OMP_NUM_THREADS=1, as torchrun gives each of one
  node's two processes). ZeRO stays off, so both ways probe alike.

    python benchmarks/scaleout.py                    # about 10 minutes on 2 cores
    python benchmarks/scaleout.py --layouts nodes    # one comparison
    python benchmarks/scaleout.py --quick            # the workers' smallest, for the suite
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import ENV, Benchmark, Figures, gpt2, header, model_folder, run, search, show, table

# the classic five only: benchmarks/levers.py measures compilation and attention
CLASSIC = ["--lever", "torch_compile=false", "--lever", "attn_implementation=sdpa"]


def workers(work: Path, quick: bool) -> Figures:
    s = {"max_trials": 12, "global_batch": 32, "seq_len": 128, "confirm_top": 2, "parity": "on"}
    if quick:  # the script end to end; parity for one worker and two has its own tests
        s = {"max_trials": 4, "global_batch": 16, "seq_len": 64, "confirm_top": 1, "parity": "off"}
    runs = {}
    for parallel in (1, 2):
        searched = search(
            work,
            f"workers-{parallel}",
            *("--model", "./bench-gpt2", "--device", "cpu", *CLASSIC),
            *("--global-batch-size", str(s["global_batch"]), "--seq-len", str(s["seq_len"])),
            *("--precisions", "fp32,bf16", "--optimizers", "adamw_torch,adafactor,adamw_bnb_8bit"),
            *("--max-trials", str(s["max_trials"]), "--confirm-top", str(s["confirm_top"])),
            *("--parity", s["parity"], "--parallel", str(parallel), "--quiet"),
        )
        best = searched.best or {}
        runs[parallel] = {
            "wall_s": searched.wall_s,
            "probes": len(searched.probes),
            "best": best.get("config"),
            "best_samples_per_s": best.get("samples_per_s"),
        }
    return {
        **s,
        "one": runs[1],
        "two": runs[2],
        "ratio": round(runs[1]["wall_s"] / runs[2]["wall_s"], 2),
    }


NODES_TRIALS = 4


def node_search(work: Path, study: str, storage: Path) -> list[str]:
    return [
        *("search", "--model", "./bench-gpt2", "--device", "cpu", "--study", study),
        *("--storage", str(storage), "--no-reuse", "--no-rehearse", "--parity", "off"),
        *("--confirm-top", "0", *CLASSIC, "--lever", "zero_stage=0"),
        *("--global-batch-size", "32", "--seq-len", "128", "--precisions", "fp32"),
        *("--optimizers", "adamw_torch,adafactor", "--checkpointing", "off"),
        *("--max-trials", str(NODES_TRIALS), "--warmup-steps", "2", "--measure-steps", "3"),
        *("--fixed-steps", "--quiet"),
    ]


def one_node(work: Path, study: str) -> float:
    command = [sys.executable, "-m", "autotune", *node_search(work, study, work / "one.log")]
    started = time.monotonic()
    done = subprocess.run(
        [*command, "--nproc-per-node", "2"], cwd=work, env=ENV, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"1 node x 2 failed: {done.stderr[-800:]}")
    return time.monotonic() - started


def two_nodes(work: Path, study: str) -> float:
    command = [sys.executable, "-m", "autotune", *node_search(work, study, work / "two.log")]
    command += ["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1"]
    # one core a node: on separate machines the nodes would not share cores
    env = {**ENV, "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    follower = subprocess.Popen(
        [*command, "--node-rank", "1"],
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    head = subprocess.run(
        [*command, "--node-rank", "0"], cwd=work, env=env, capture_output=True, text=True
    )
    wall = time.monotonic() - started
    _, err = follower.communicate(timeout=120)
    if head.returncode != 0 or follower.returncode != 0:
        raise SystemExit(f"2 nodes x 1 failed: {head.stderr[-800:]} {err[-400:]}")
    return wall


def nodes(work: Path, rounds: int) -> Figures:
    runs: dict[str, list[Figures]] = {"1x2": [], "2x1": []}
    for r in range(rounds):
        for way in ("1x2", "2x1") if r % 2 == 0 else ("2x1", "1x2"):
            study = f"{way}-{r}"
            wall = (one_node if way == "1x2" else two_nodes)(work, study)
            storage = str(work / ("one.log" if way == "1x2" else "two.log"))
            ok = [t for t in show(work, study, storage)["trials"] if t["outcome"] == "ok"]
            runs[way].append(
                {
                    "wall_s": round(wall, 1),
                    "probes": len(ok),
                    "per_probe_s": round(wall / max(1, len(ok)), 1),
                    "samples_per_s": {t["config"]: t["samples_per_s"] for t in ok},
                }
            )
            print(way, runs[way][-1], flush=True)
    per_probe = {w: statistics.mean(r["per_probe_s"] for r in rs) for w, rs in runs.items()}
    return {
        "rounds": rounds,
        "runs": runs,
        "overhead_per_probe_s": round(per_probe["2x1"] - per_probe["1x2"], 1),
    }


def measure(args: argparse.Namespace, work: Path) -> Figures:
    model_folder(work, "bench-gpt2", gpt2())
    figures: Figures = {}
    if "workers" in args.layouts:
        figures["workers"] = workers(work, args.quick)
    if "nodes" in args.layouts and not args.quick:
        figures["nodes"] = nodes(work, args.rounds)
    return figures


def report(f: Figures) -> str:
    text = header(f, "One search spread over workers and nodes")
    if "workers" in f:
        w = f["workers"]
        text += (
            f"\nWorkers: {w['seq_len']} tokens, global batch {w['global_batch']}, fp32/bf16, "
            f"AdamW/Adafactor/8-bit AdamW, --max-trials {w['max_trials']}, --confirm-top "
            f"{w['confirm_top']}, parity {w['parity']}; the whole command's wall.\n\n"
        )
        rows = [
            (name, f"{r['wall_s']:.0f} s", r["probes"], r["best"], r["best_samples_per_s"])
            for name, r in (("1 worker", w["one"]), ("2 workers (--parallel 2)", w["two"]))
        ]
        text += table(("search", "wall", "probes", "selected", "selected samples/s (alone)"), rows)
        text += f"\n1 worker / 2 workers wall time: **{w['ratio']}x**.\n"
    if "nodes" in f:
        n = f["nodes"]
        text += (
            f"\nNodes: 128 tokens, global batch 32, fp32, AdamW and Adafactor, no checkpointing, "
            f"no ZeRO, {NODES_TRIALS} probes of 2 warm-up and 3 timed steps, no confirmation, "
            f"parity or rehearsal; {n['rounds']} interleaved rounds.\n\n"
        )
        rows = [
            (
                label,
                f"{r['wall_s']:.0f} s",
                r["probes"],
                f"{r['per_probe_s']:.1f} s",
                ", ".join(f"{c}: {s:.1f}" for c, s in sorted(r["samples_per_s"].items())),
            )
            for way, label in (("1x2", "1 node x 2 processes"), ("2x1", "2 nodes x 1 process"))
            for r in n["runs"][way]
        ]
        text += table(("layout", "wall", "probes", "wall per probe", "samples/s per config"), rows)
        text += f"\nAcross nodes each probe costs {n['overhead_per_probe_s']:+.1f} s more than on one node.\n"
    return text


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layouts", default="workers,nodes", help="workers, nodes or both")
    parser.add_argument(
        "--rounds", type=int, default=2, help="interleaved rounds of the nodes' pair"
    )


if __name__ == "__main__":
    run(Benchmark("scaleout", __doc__, measure, report, options))
