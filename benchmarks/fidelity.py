#!/usr/bin/env python
"""Do the probe's figures hold in a real, longer training run?

`autotune search` on a small causal LM under a memory budget; then three of its
configs (the selected one, a middling one, and the fitting one nearest the budget)
each train for many more steps in a real Trainer run (not the probe) under the same
RLIMIT_DATA. Reports long-run throughput / probe throughput and long-run peak /
probe peak; the long runs must not run out of memory. Appends to RESULTS.md.

    python benchmarks/fidelity.py            # a few minutes on 2 cores
    python benchmarks/fidelity.py --quick    # smaller, for the CI smoke test
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from _common import autotune, machine, save, train

MODEL = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_embd": 192,
    "n_layer": 4,
    "n_head": 4,
    "n_positions": 512,
    "vocab_size": 8192,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "global_batch": 16,
            "seq_len": 64,
            "budget_mib": 1000,
            "long_steps": 5,  # the first two are not timed: three steady steps
            "max_trials": 3,
            # the smoke run checks the script end to end: one finalist measured again, and
            # no parity, which fidelity does not measure and which has its own tests
            # (tests/tuning/test_parity_search.py)
            "confirm_top": 1,
            "parity": "off",
        }
    return {
        "global_batch": 32,
        "seq_len": 256,
        "budget_mib": 1300,
        "long_steps": 60,
        "parity": "on",
        "max_trials": 12,
        "confirm_top": 3,  # the search's default
    }


def pick(study_json: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The selected config, a middling one, and the fitting one with the highest peak."""
    fit = [t for t in study_json["trials"] if t["outcome"] == "ok" and not t["why"]]
    by_speed = sorted(fit, key=lambda t: -t["samples_per_s"])
    selected = next(t for t in fit if t["best"])
    others = [t for t in by_speed if t is not selected]
    middle = others[len(others) // 2] if others else selected
    rest = [t for t in others if t is not middle] or [selected]
    return {
        "selected": selected,
        "middle": middle,  # three distinct configs where there are
        "nearest the budget": max(rest, key=lambda t: t["peak_memory_gib"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-append", action="store_true")
    options = parser.parse_args()
    s = settings(options.quick)
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "bench-gpt2").mkdir()
        (work / "bench-gpt2" / "config.json").write_text(json.dumps(MODEL))
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
            "--memory-budget",
            f"{s['budget_mib']}MiB",
            "--global-batch-size",
            str(s["global_batch"]),
            "--seq-len",
            str(s["seq_len"]),
            "--max-trials",
            str(s["max_trials"]),
            "--confirm-top",
            str(s["confirm_top"]),
            "--parity",
            s["parity"],
            "--quiet",
        )
        if done.returncode != 0:
            raise SystemExit(f"autotune search failed: {done.stderr[-500:]}")
        shown = json.loads(
            autotune(work, "show", "--study", "bench-gpt2", "--format", "json").stdout
        )
        for name, trial in pick(shown).items():
            args = {k: v for k, v in trial["training_arguments"].items()}
            batch = args["per_device_train_batch_size"] * args["gradient_accumulation_steps"]
            spec = {
                "model": MODEL,
                "task": "causal-lm",
                "seq_len": s["seq_len"],
                "target_len": 0,
                "budget_bytes": s["budget_mib"] * 2**20,
                "num_samples": batch * (s["long_steps"] + 2),
                "args": {
                    "output_dir": "out",
                    "report_to": "none",
                    "save_strategy": "no",
                    "max_steps": s["long_steps"],
                    "disable_tqdm": True,
                    **args,
                },
            }
            run = train(spec, work)
            probe_peak = trial["peak_memory_gib"] * 2**30
            rows[name] = {
                "trial": trial["trial"],
                "config": trial["config"],
                "probe_samples_per_s": trial["samples_per_s"],
                "probe_peak_bytes": int(probe_peak),
                "long_outcome": run["outcome"],
                "long_samples_per_s": run.get("steady_samples_per_s"),
                "long_peak_bytes": run.get("peak_rss_bytes"),
                "throughput_ratio": round(
                    (run.get("steady_samples_per_s") or 0) / trial["samples_per_s"], 3
                ),
                "peak_ratio": round((run.get("peak_rss_bytes") or 0) / probe_peak, 3),
            }
    figures = {**machine(), **s, "quick": options.quick, "rows": rows}
    save("fidelity", figures, markdown(figures), not options.no_append)


def markdown(f: dict[str, Any]) -> str:
    table = "\n".join(
        f"| {name} | {r['config']} (trial {r['trial']}) | {r['probe_samples_per_s']:.2f} | "
        f"{r['long_samples_per_s'] or 0:.2f} | {r['throughput_ratio']} | "
        f"{r['probe_peak_bytes'] / 2**30:.2f} GiB | {(r['long_peak_bytes'] or 0) / 2**30:.2f} GiB | "
        f"{r['peak_ratio']} | {r['long_outcome']} |"
        for name, r in f["rows"].items()
    )
    return f"""
## Fidelity: probe figures against a long real run ({f["date"]}{", quick" if f["quick"] else ""})

Machine: {f["machine"]}; {f["versions"]}. Command: `python benchmarks/fidelity.py{" --quick" if f["quick"] else ""}`.
A GPT-2-style model (n_embd 192, 4 layers, vocab 8192), {f["seq_len"]} tokens, global batch {f["global_batch"]},
budget {f["budget_mib"]} MiB (RLIMIT_DATA). Each long run: {f["long_steps"]} optimizer steps of a real Trainer
(steady samples/s: the steps after the first two; peak: the process's peak RSS).

| config | settings | probe samples/s | long-run samples/s | ratio | probe peak | long-run peak | ratio | long run |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{table}
"""


if __name__ == "__main__":
    main()
