"""Graded checkpointing (#47), measured where memory binds: each level's best config
timed side by side, and the level a search picks.

For each level (off, every 4th layer, every 2nd, every layer; offloaded on CUDA) the
largest batch that fits the limit is found by probing down from the largest, then those
configs are timed in interleaved rounds (benchmarks/_truth.py: paired ratios to the
best, with 95% intervals), each with its peak. Then `autotune search` runs under the
same budget and says which config it picks: an intermediate level should win wherever
it is faster than both ends (off at the smaller batch it fits, on at the larger one).

    python benchmarks/checkpoint_levels.py                 # CPU, about 25 minutes
    python benchmarks/checkpoint_levels.py --device cuda --budget 6GiB --layers 12 \\
        --hidden 768 --seq-len 1024 --global-batch 32

Run it alone on the machine: the figures are throughputs. It prints the table and, with
--append, adds it to benchmarks/RESULTS.md (figures to checkpoint_levels.json).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import autotune, machine, save
from _truth import Truth, measure
from search_efficiency import score  # samples/s within the limit, as the search judges

from autotune.core.checkpointing import Checkpointing
from autotune.core.enums import DeviceKind
from autotune.core.space import batch_choices
from autotune.core.trial import Candidate, ModelSpec, TrialConfig, TrialResult
from autotune.core.units import parse_size
from autotune.launch.forkserver import ForkServer
from autotune.launch.runner import run_trial
from autotune.probe.shared_model import SharedModel

MIB = 2**20
WARMUP, MEASURE = 2, 3


def model_config(layers: int, hidden: int, heads: int, seq_len: int) -> dict[str, Any]:
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": hidden,
        "n_layer": layers,
        "n_head": heads,
        "n_positions": seq_len,
        "vocab_size": 1024,  # logits small beside the layers: what the levels act on
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
    }


class Prober:
    """Probes of one model under one limit (on the CPU through a fork server)."""

    def __init__(self, o: argparse.Namespace, limit: int | None, work: Path) -> None:
        self.o, self.limit, self.work, self.count = o, limit, work, 0
        self.model = ModelSpec(
            "bench", "local", "causal-lm", model_config(o.layers, o.hidden, o.heads, o.seq_len)
        )
        cpu = o.device == DeviceKind.CPU
        shared = SharedModel(self.model, 0, {"attn_implementation": "sdpa"})
        self.server = (
            ForkServer(work / "server.log", data_limit=limit, shared=shared) if cpu else None
        )

    def __call__(self, key: tuple[int, str], measure_steps: int = MEASURE) -> TrialResult:
        batch, level = key
        self.count += 1
        config = TrialConfig(
            number=self.count,
            trial_dir=str(self.work / "probes" / str(self.count)),
            model=self.model,
            candidate=Candidate(
                batch,
                self.o.global_batch // batch,
                self.o.precision,
                Checkpointing(level),
                "adamw_torch",
                attn_implementation="sdpa",
            ),
            device="cpu" if self.o.device == DeviceKind.CPU else "cuda:0",
            seq_len=self.o.seq_len,
            target_len=0,
            memory_limit_bytes=self.limit,
            warmup_steps=WARMUP,
            measure_steps=measure_steps,
        )
        return run_trial(config, timeout_s=600, server=self.server)

    def speed(self, key: tuple[int, str]) -> float:
        return score(self(key), self.limit or 0)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def largest_fitting(prober: Prober, level: str, batches: list[int]) -> dict[str, Any]:
    """The level's largest batch that runs within the limit, probing down from the top."""
    tried = []
    for batch in sorted(batches, reverse=True):
        result = prober((batch, level))
        peak = result.peak_memory_bytes or 0
        tried.append({"batch": batch, "outcome": str(result.outcome), "peak_mib": peak // MIB})
        if score(result, prober.limit or 0) > 0:
            return {"key": (batch, level), "peak_mib": peak // MIB, "tried": tried}
    return {"key": None, "tried": tried}


def search(o: argparse.Namespace, work: Path, model_dir: Path) -> dict[str, Any]:
    args = [
        "search",
        "--model",
        str(model_dir),
        "--study",
        "levels",
        "--device",
        o.device,
        "--global-batch-size",
        str(o.global_batch),
        "--seq-len",
        str(o.seq_len),
        "--precisions",
        o.precision,
        "--optimizers",
        "adamw_torch",
        "--lever",
        "attn_implementation=sdpa",
        "--lever",
        "torch_compile=false",
        "--memory-budget",
        o.budget,
        "--headroom",
        "0",
        "--time-budget",
        o.time_budget,
        "--parity",
        "off",
        "--no-rehearse",
    ]
    started = time.monotonic()
    done = autotune(work, *args)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"autotune search failed:\n{done.stderr[-2000:]}")
    shown = autotune(work, "show", "--study", "levels", "--format", "json")
    view = json.loads(shown.stdout)
    best = next(t for t in view["trials"] if t.get("best"))
    return {
        "wall_s": round(wall, 1),
        "picked": best["config"],
        "probed": [
            {
                "config": t["config"],
                "outcome": t["outcome"],
                "samples_per_s": t["samples_per_s"],
                "peak_gib": t["peak_memory_gib"],
            }
            for t in view["trials"]
        ],
        "output": done.stdout[-3000:],
    }


def table(levels: dict[str, dict[str, Any]], truth: Truth[tuple[int, str]]) -> str:
    lines = [
        "| level | largest batch that fits | peak MiB | samples/s (median of rounds) | vs the best (95% CI) |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for level, found in levels.items():
        key = found["key"]
        if key is None:
            lines.append(f"| {level} | none | | | |")
            continue
        rounds = truth.runs[key]
        speeds = sorted(v for v in rounds.values() if v > 0)
        median = speeds[len(speeds) // 2] if speeds else 0.0
        ratio = truth.ratios.get(key, 1.0)
        half = truth.half_widths.get(key, 0.0)
        best = " (best)" if key == truth.best else ""
        lines.append(
            f"| {level} | {key[0]} | {found['peak_mib']} | {median:.2f} | "
            f"{ratio:.3f} +-{half:.1%}{best} |"
        )
    return "\n".join(lines)


def auto_budget(o: argparse.Namespace, work: Path) -> str:
    """A limit between the peaks of one sample without checkpointing and with every 4th
    layer checkpointed (measured, no limit): the place where memory binds by a level."""
    (work / "auto").mkdir()
    prober = Prober(o, None, work / "auto")
    try:
        off, quarter = (prober((1, level)) for level in ("off", "every-4"))
    finally:
        prober.close()
    peaks = [r.peak_memory_bytes for r in (off, quarter)]
    if None in peaks or peaks[1] >= peaks[0]:
        raise SystemExit(f"--budget auto: no gap between the levels' peaks ({off}, {quarter})")
    return f"{(peaks[0] + peaks[1]) // 2 // MIB}MiB"


def side_by_side(
    o: argparse.Namespace, work: Path
) -> tuple[dict[str, dict[str, Any]], Truth[tuple[int, str]], float]:
    levels = [c.value for c in Checkpointing if o.device == "cuda" or c != Checkpointing.OFFLOAD]
    regular, fallback = batch_choices(o.global_batch)
    prober = Prober(o, parse_size(o.budget), work)
    started = time.monotonic()
    try:
        found = {lv: largest_fitting(prober, lv, [*regular, *fallback]) for lv in levels}
        keys = [f["key"] for f in found.values() if f["key"] is not None]
        truth = measure(prober.speed, keys)
    finally:
        prober.close()
    return found, truth, time.monotonic() - started


def probed_table(searched: dict[str, Any]) -> str:
    lines = ["| config | outcome | samples/s | peak GiB |", "| --- | --- | ---: | ---: |"]
    for t in searched["probed"]:
        speed = f"{t['samples_per_s']:.2f}" if t["samples_per_s"] else ""
        peak = f"{t['peak_gib']:.2f}" if t["peak_gib"] else ""
        lines.append(f"| {t['config']} | {t['outcome']} | {speed} | {peak} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    # many narrow heads: attention's activations (heads x seq^2) large for its compute
    parser.add_argument("--heads", type=int, default=8)
    # long sequences: without checkpointing not even one sample fits the limit
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--global-batch", type=int, default=4)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument(
        "--budget", default="1536MiB", help="auto: between one sample's peaks off and every-4"
    )
    parser.add_argument("--time-budget", default="4m")
    parser.add_argument(
        "--search-only", action="store_true", help="no side-by-side rounds: the search alone"
    )
    parser.add_argument("--append", action="store_true", help="add to RESULTS.md")
    o = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="autotune-levels-") as tmp:
        work = Path(tmp)
        model_dir = work / "model"
        model_dir.mkdir()
        config = model_config(o.layers, o.hidden, o.heads, o.seq_len)
        (model_dir / "config.json").write_text(json.dumps(config))
        if o.budget == "auto":
            o.budget = auto_budget(o, work)
            print(f"budget: {o.budget}", flush=True)
        found, truth, side_s = ({}, None, 0.0) if o.search_only else side_by_side(o, work)
        searched = search(o, work, model_dir)
    report(o, found, truth, side_s, searched)


def report(
    o: argparse.Namespace,
    found: dict[str, dict[str, Any]],
    truth: Truth[tuple[int, str]] | None,
    side_s: float,
    searched: dict[str, Any],
) -> None:
    shape = (
        f"GPT-2 shape, {o.layers} layers, hidden {o.hidden}, {o.heads} heads, {o.seq_len} "
        f"tokens, global batch {o.global_batch}, {o.precision}, adamw_torch, limit "
        f"{o.budget}, {o.device}"
    )
    m = {**machine(), **_gpu(o.device)}
    figures: dict[str, Any] = {**m, "shape": shape, "search": searched}
    text = f"`python benchmarks/checkpoint_levels.py {_argv(o)}` on {m['machine']} ({m['versions']}). {shape}."
    if truth is not None:
        figures["levels"] = {lv: {**f, "key": list(f["key"] or [])} for lv, f in found.items()}
        figures["truth"] = {
            f"{k[0]} {k[1]}": {
                "rounds": r,
                "ratio": truth.ratios.get(k),
                "half": truth.half_widths.get(k),
            }
            for k, r in truth.runs.items()
        }
        figures["best"] = list(truth.best)
        text += (
            f" Each level's largest batch within the limit, then those configs timed in "
            f"interleaved rounds ({side_s:.0f} s):\n\n{table(found, truth)}\n\n"
            f"The fastest level: **{truth.best[1]}** at batch {truth.best[0]}."
        )
    text += (
        f" `autotune search` under the same budget ({searched['wall_s']} s) picked: "
        f"**{searched['picked']}**, from:\n\n{probed_table(searched)}\n"
    )
    markdown = f"\n## Graded checkpointing where memory binds ({m['date']}, {o.device})\n\n{text}"
    save(
        "checkpoint_levels" if o.device == "cpu" else "checkpoint_levels_cuda",
        figures,
        markdown,
        o.append,
    )


def _gpu(device: str) -> dict[str, str]:
    """On CUDA, the GPU is the machine that matters."""
    if device != "cuda":
        return {}
    import torch

    return {"machine": f"{torch.cuda.get_device_name(0)} (host: {machine()['machine']})"}


def _argv(o: argparse.Namespace) -> str:
    return (
        f"--device {o.device} --layers {o.layers} --hidden {o.hidden} --heads {o.heads} "
        f"--seq-len {o.seq_len} --global-batch {o.global_batch} --precision {o.precision} "
        f"--budget {o.budget} --time-budget {o.time_budget}"
        + (" --search-only" if o.search_only else "")
    )


if __name__ == "__main__":
    main()
