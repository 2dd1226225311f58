#!/usr/bin/env python
"""Do a probe's figures hold in a real, longer training run?

One `autotune search` of a small GPT-2-style model on this CPU; then three configs it
found to fit each train many more steps in a real Trainer run with that trial's exact
training arguments, on worst-case-length data as the probe's, beside its probe:

- capped: the selected config, a middling one and the one nearest the budget (1300
  MiB), 60 steps each under the same RLIMIT_DATA: samples/s and peak against the
  probe's. None may run out of memory.
- events: the selected config and those with the highest and the lowest probe peak
  (a generous 4 GiB), 200 steps each, evaluating every 50 and saving every 100, with
  no RLIMIT_DATA. A config fits when its probe's peak is within budget x (1 -
  headroom), so a run peaking at `ratio` x its probe's stays within the budget, even
  from the fit limit's edge, when the headroom is at least 1 - 1/ratio: does the
  default's?

    python benchmarks/fidelity.py                  # about 10 minutes on 2 cores, alone
    python benchmarks/fidelity.py --runs events    # one setting
    python benchmarks/fidelity.py --quick          # both at their smallest, for the suite
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness import (
    CLASSIC,
    Benchmark,
    Figures,
    gpt2,
    header,
    model_folder,
    run,
    search,
    side_by_side,
    table,
    trainer_spec,
)

from autotune.tuning.options import SearchOptions

# what a long run does after its first steps, each credited with the peak's rise in it
LATER = {"later_steps": "later steps", "evaluations": "evaluations", "saves": "saves"}


def capped(quick: bool) -> Figures:
    s: Figures = {"global_batch": 32, "seq_len": 256, "budget_mib": 1300, "long_steps": 60}
    s |= {"max_trials": 12, "confirm_top": 3, "parity": "on"}
    if quick:  # end to end: one finalist, no parity (tests/tuning/test_parity_search.py)
        s |= {"global_batch": 16, "seq_len": 64, "budget_mib": 1000, "long_steps": 5}
        s |= {"max_trials": 3, "confirm_top": 1, "parity": "off"}
    return {
        **s,
        "model": gpt2(n_embd=192, n_layer=4, n_positions=512, vocab_size=8192),
        "budget": f"{s['budget_mib']}MiB",
        "search": [
            *("--memory-budget", f"{s['budget_mib']}MiB", "--max-trials", str(s["max_trials"])),
            *("--confirm-top", str(s["confirm_top"]), "--parity", s["parity"]),
        ],
        "long_args": {},  # the trial's own
        "spec": {"budget_bytes": s["budget_mib"] * 2**20},
    }


def events(quick: bool) -> Figures:
    s: Figures = {"global_batch": 16, "seq_len": 256, "budget": "4GiB", "time_budget": "3m"}
    s |= {"long_steps": 200, "eval_steps": 50, "save_steps": 100, "eval_samples": 64}
    s |= {"max_trials": 12}
    if quick:  # three probes, each of which fits, whatever the host's speed
        s |= {"long_steps": 20, "eval_steps": 5, "save_steps": 10, "seq_len": 64}
        s |= {"max_trials": 3, "time_budget": "10m"}
    return {
        **s,
        "model": gpt2(n_embd=256, n_layer=4, n_positions=256, pad_token_id=0),
        "headroom_default": SearchOptions().headroom,
        "search": [
            *("--precisions", "fp32,bf16", "--optimizers", "adamw_torch,adafactor"),
            *("--checkpointing", "off", "--memory-budget", s["budget"]),
            *("--time-budget", s["time_budget"], "--max-trials", str(s["max_trials"])),
            *("--parity", "off"),
            *("--no-rehearse", "--confirm-top", "0", "--confirm-rounds", "0"),
        ],
        "long_args": {
            **{"eval_strategy": "steps", "eval_steps": s["eval_steps"]},
            **{"save_strategy": "steps", "save_steps": s["save_steps"]},
            **{"logging_strategy": "steps", "logging_steps": s["eval_steps"]},
        },
        "spec": {
            "budget_bytes": None,  # measured, not capped
            "attn_implementation": "sdpa",  # the search's, fixed by --lever
            "eval_samples": s["eval_samples"],
            "num_samples": s["global_batch"] * s["long_steps"],
        },
    }


def pick(trials: list[dict[str, Any]], spread: bool) -> dict[str, dict[str, Any]]:
    """The selected config and two other fitting ones: a middling one and the one nearest
    the budget, or (`spread`) those with the highest and the lowest probe peak."""
    fit = [t for t in trials if t["outcome"] == "ok" and not t["why"] and t["peak_memory_gib"]]
    selected = next(t for t in fit if t["best"])
    others = [t for t in fit if t is not selected]
    if spread:
        if len(others) < 2:
            raise SystemExit(f"{len(fit)} fitting configs, 3 needed: give it more time")
        by_peak = sorted(others, key=lambda t: t["peak_memory_gib"])
        return {"selected": selected, "highest peak": by_peak[-1], "lowest peak": by_peak[0]}
    by_speed = sorted(others, key=lambda t: -t["samples_per_s"])
    middle = by_speed[len(by_speed) // 2] if by_speed else selected
    rest = [t for t in by_speed if t is not middle] or [selected]
    nearest = max(rest, key=lambda t: t["peak_memory_gib"])
    return {"selected": selected, "middle": middle, "nearest the budget": nearest}


def long_runs(work: Path, name: str, quick: bool) -> Figures:
    """One search, then three of its configs trained long, each beside its probe."""
    s = (capped if name == "capped" else events)(quick)
    work = work / name
    model_folder(work, "model", s["model"])
    searched = search(
        work,
        name,
        *("--model", "./model", "--device", "cpu", *CLASSIC, *s["search"], "--quiet"),
        *("--global-batch-size", str(s["global_batch"]), "--seq-len", str(s["seq_len"])),
    )
    picked = pick(searched.trials, spread=name == "events")
    ways = {
        role: {**t["training_arguments"], **s["long_args"], "output_dir": str(work / role)}
        for role, t in picked.items()
    }

    def spec(args: dict[str, Any]) -> dict[str, Any]:
        seq_len, steps = s["seq_len"], s["long_steps"]
        return trainer_spec(s["model"], "causal-lm", seq_len, args, steps, **s["spec"])

    runs = side_by_side(work, ways, spec)
    return {
        **s,
        "search_wall_s": searched.wall_s,
        "probed": [
            {k: t[k] for k in ("trial", "config", "outcome", "peak_memory_gib", "why")}
            for t in searched.trials
        ],
        "rows": {role: beside(trial, runs[role][0]) for role, trial in picked.items()},
    }


def beside(trial: dict[str, Any], run: dict[str, Any]) -> Figures:
    """A long run's figures beside its probe's."""
    probe_peak, peak = trial["peak_memory_gib"] * 2**30, run.get("peak_rss_bytes") or 0
    speed = run.get("steady_samples_per_s") or 0.0
    return {
        "trial": trial["trial"],
        "config": trial["config"],
        "selected": trial["best"],
        "training_arguments": trial["training_arguments"],
        "probe_samples_per_s": trial["samples_per_s"],
        "probe_peak_bytes": int(probe_peak),
        "long_outcome": run["outcome"],
        "long_samples_per_s": speed,
        "long_peak_bytes": peak,
        "throughput_ratio": round(speed / trial["samples_per_s"], 3),
        "peak_ratio": round(peak / probe_peak, 4),
        "headroom_needed": round(1 - probe_peak / peak, 4) if peak else None,
        "before_evaluation_bytes": run.get("peak_before_evaluation_bytes"),
        "grew_bytes": run.get("peak_grew_bytes"),
        "data_segment_max_bytes": run.get("data_segment_max_bytes"),
        "wall_s": round(run.get("process_wall_s", run["wall_s"]), 1),
        "error": run.get("error", ""),
    }


def measure(args: argparse.Namespace, work: Path) -> Figures:
    return {
        name: long_runs(work, name, args.quick)
        for name in ("capped", "events")
        if name in args.runs
    }


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def report(f: Figures) -> str:
    text = header(f, "Fidelity: a probe's figures against a long real run")
    for name in ("capped", "events"):
        if name in f:
            text += section(name, f[name])
    return text


def section(name: str, s: Figures) -> str:
    m = s["model"]
    text = (
        f"\n{name.capitalize()}: GPT-2 shape, {m['n_layer']} layers, {m['n_embd']} wide, "
        f"vocab {m['vocab_size']}, {s['seq_len']} tokens, global batch {s['global_batch']}, "
        f"{s['budget']}; a search of {s['search_wall_s']:.0f} s ({len(s['probed'])} probes), "
        f"then {s['long_steps']} steps a long run (steady samples/s: after the first two; "
        "peaks: peak RSS).\n\n"
    )
    columns = ["config", "settings", "probe samples/s", "long-run samples/s", "ratio"]
    columns += ["probe peak", "long-run peak", "ratio", "headroom it needs", "long run"]
    rows = []
    for role, r in s["rows"].items():
        rows.append(
            [
                role,
                f"{r['config']} (trial {r['trial']})",
                f"{r['probe_samples_per_s']:.2f}",
                f"{r['long_samples_per_s']:.2f}",
                r["throughput_ratio"],
                mib(r["probe_peak_bytes"]),
                mib(r["long_peak_bytes"]),
                r["peak_ratio"],
                "-" if r["headroom_needed"] is None else f"{r['headroom_needed']:.1%}",
                f"{r['long_outcome']}, {r['wall_s']:.0f} s",
            ]
        )
        if name == "events":  # where the peak rose after the first evaluation's steps
            rows[-1].append(" / ".join(mib(r["grew_bytes"][event]) for event in LATER))
    if name == "events":
        columns.append(f"rise after {s['eval_steps']} steps: {' / '.join(LATER.values())}")
    text += table(columns, rows)
    return text + (conclusion(s) if name == "events" else "")


def conclusion(s: Figures) -> str:
    """Whether the default headroom covers the largest growth seen."""
    headroom = s["headroom_default"]
    worst = max(s["rows"].values(), key=lambda r: r["peak_ratio"])
    edge = worst["peak_ratio"] * (1 - headroom)  # its peak / budget, probed at the fit limit
    covers = "covers" if worst["headroom_needed"] <= headroom else "does not cover"
    return (
        f"\nThe largest growth, {worst['config']}'s ({worst['peak_ratio'] - 1:+.1%}), needs a "
        f"headroom of {worst['headroom_needed']:.1%}: probed at the fit limit, it would peak at "
        f"{edge:.1%} of the budget: the default {headroom:.0%} {covers} it.\n"
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", default="capped,events", help="capped, events or both")


if __name__ == "__main__":
    run(Benchmark("fidelity", __doc__, measure, report, options))
