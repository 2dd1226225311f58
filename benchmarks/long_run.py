"""The long run (#50): a probe's peak against a real run's, evaluations and saves included,
and whether the default headroom covers the difference.

One `autotune search` (CPU, a generous budget, no parity, rehearsal or paired rounds)
probes a small GPT-2 shape; three of the configs that fit (the selected one and the
fitting ones with the highest and the lowest probe peak) then each train a real
Trainer run of 200 optimizer steps with that trial's exact training arguments, an
evaluation every 50 steps and a checkpoint save every 100, on worst-case-length data
as the probe's (so the difference is the run's events and its length, not its data).
The long runs have no RLIMIT_DATA: their peaks are measured, not capped. A config
fits when its probe's peak is within budget x (1 - headroom); a run whose peak is
`ratio` x its probe's stays within the budget, even from the fit limit's edge, when
the headroom is at least 1 - 1/ratio.

    python benchmarks/long_run.py                 # CPU, about 5 minutes on 2 cores
    python benchmarks/long_run.py --steps 20 --eval-steps 5 --save-steps 10 \\
        --time-budget 1m                          # a check that it runs

Run it alone on the machine. It prints the table and, with --append, adds it to
benchmarks/RESULTS.md (figures to long_run.json).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import autotune, machine, save, train

from autotune.tuning.options import SearchOptions

GIB = float(2**30)
STUDY = "long-run"


def model_config(o: argparse.Namespace) -> dict[str, Any]:
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": o.hidden,
        "n_layer": o.layers,
        "n_head": o.heads,
        "n_positions": o.seq_len,
        "vocab_size": o.vocab,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
    }


def search(o: argparse.Namespace, work: Path, model_dir: Path) -> dict[str, Any]:
    """One search; returns `autotune show --format json` of it and its wall time."""
    started = time.monotonic()
    done = autotune(
        work,
        "search",
        "--model",
        str(model_dir),
        "--study",
        STUDY,
        "--device",
        "cpu",
        "--global-batch-size",
        str(o.global_batch),
        "--seq-len",
        str(o.seq_len),
        "--precisions",
        o.precisions,
        "--optimizers",
        o.optimizers,
        "--checkpointing",
        "off",
        # the classic dimensions only: benchmarks/levers.py measures these two
        "--lever",
        "torch_compile=false",
        "--lever",
        "attn_implementation=sdpa",
        "--memory-budget",
        o.budget,
        "--time-budget",
        o.time_budget,
        "--max-trials",
        str(o.max_trials),
        "--parity",
        "off",
        "--no-rehearse",
        "--confirm-top",
        "0",
        "--confirm-rounds",
        "0",
        "--quiet",
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"autotune search failed:\n{done.stderr[-2000:]}")
    shown = autotune(work, "show", "--study", STUDY, "--format", "json")
    if shown.returncode != 0:
        raise SystemExit(f"autotune show failed:\n{shown.stderr[-2000:]}")
    return {"wall_s": round(wall, 1), "view": json.loads(shown.stdout)}


def pick(trials: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """The selected config, then the fitting ones with the highest and the lowest probe
    peak, and so on inwards: `count` distinct configs that span the peaks."""
    fit = [t for t in trials if t["outcome"] == "ok" and not t["why"] and t["peak_memory_gib"]]
    if len(fit) < count:
        raise SystemExit(
            f"the search left {len(fit)} fitting configs, {count} needed: "
            "give it a longer --time-budget or more --max-trials"
        )
    chosen = [t for t in fit if t["best"]][:1]
    by_peak = sorted((t for t in fit if t not in chosen), key=lambda t: -t["peak_memory_gib"])
    while len(chosen) < count:
        chosen.append(by_peak.pop(0 if len(chosen) % 2 else -1))
    return chosen


def long_run(
    o: argparse.Namespace, trial: dict[str, Any], model: dict[str, Any], work: Path
) -> dict[str, Any]:
    """The trial's exact training arguments for --steps steps, evaluating and saving."""
    args = dict(trial["training_arguments"])
    global_batch = args["per_device_train_batch_size"] * args["gradient_accumulation_steps"]
    run = train(
        {
            "model": model,
            "task": "causal-lm",
            "attn_implementation": "sdpa",  # the search's, fixed by --lever
            "seq_len": o.seq_len,
            "target_len": 0,
            "budget_bytes": None,  # measured, not capped
            "num_samples": global_batch * o.steps,
            "eval_samples": o.eval_samples,
            "args": {
                **args,
                "output_dir": str(work / f"run-{trial['trial']}"),
                "report_to": "none",
                "max_steps": o.steps,
                "eval_strategy": "steps",
                "eval_steps": o.eval_steps,
                "save_strategy": "steps",
                "save_steps": o.save_steps,
                "logging_strategy": "steps",
                "logging_steps": o.eval_steps,
                "disable_tqdm": True,
            },
        },
        work,
    )
    if run["outcome"] != "ok":
        raise SystemExit(f"the long run of {trial['config']} failed: {run.get('error', '')}")
    probe = trial["peak_memory_gib"] * GIB
    peak = run["peak_rss_bytes"]
    return {
        "trial": trial["trial"],
        "config": trial["config"],
        "selected": trial["best"],
        "training_arguments": args,
        "probe_peak_bytes": int(probe),
        "before_evaluation_bytes": run["peak_before_evaluation_bytes"],
        "long_peak_bytes": peak,
        "ratio": round(peak / probe, 4),
        "growth": round(peak / probe - 1, 4),
        "headroom_needed": round(1 - probe / peak, 4),  # from the fit limit's very edge
        "grew_bytes": run["peak_grew_bytes"],
        "data_segment_max_bytes": run["data_segment_max_bytes"],
        "wall_s": round(run["process_wall_s"], 1),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--optimizers", default="adamw_torch,adafactor")
    parser.add_argument("--budget", default="4GiB", help="generous: every config fits")
    parser.add_argument("--time-budget", default="3m")
    parser.add_argument("--max-trials", type=int, default=12)
    parser.add_argument("--configs", type=int, default=3, help="configs run long")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps of a long run")
    parser.add_argument("--eval-steps", type=int, default=50)
    parser.add_argument("--save-steps", type=int, default=100)
    parser.add_argument("--eval-samples", type=int, default=64)
    parser.add_argument("--append", action="store_true", help="add to RESULTS.md")
    return parser


def main() -> None:
    o = parser().parse_args()
    model = model_config(o)
    with tempfile.TemporaryDirectory(prefix="autotune-long-run-") as tmp:
        work = Path(tmp)
        model_dir = work / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(model))
        searched = search(o, work, model_dir)
        trials = searched["view"]["trials"]
        rows = [long_run(o, trial, model, work) for trial in pick(trials, o.configs)]
    shape = (
        f"GPT-2 shape, {o.layers} layers, hidden {o.hidden}, {o.heads} heads, vocab {o.vocab}, "
        f"{o.seq_len} tokens, global batch {o.global_batch}"
    )
    figures = {
        **machine(),
        "command": command(o),
        "shape": shape,
        "headroom_default": SearchOptions().headroom,
        "eval_steps": o.eval_steps,
        "search_wall_s": searched["wall_s"],
        "probed": [
            {k: t[k] for k in ("trial", "config", "outcome", "peak_memory_gib", "why")}
            for t in trials
        ],
        "rows": rows,
    }
    save("long_run", figures, markdown(o, figures), o.append)


# What the long run does after its first steps, each credited with the peak's rise in it
LATER = {"later_steps": "later steps", "evaluations": "evaluations", "saves": "saves"}


def table(o: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"| config | probe peak | long run's first {o.eval_steps} steps | long-run peak "
        "| long / probe | growth | headroom it needs "
        f"| rise after them: {' / '.join(LATER.values())} | long run's wall |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in rows:
        before = r["before_evaluation_bytes"]
        rises = " / ".join(_mib(r["grew_bytes"][event]) for event in LATER)
        lines.append(
            f"| {r['config']} (trial {r['trial']}{', selected' if r['selected'] else ''}) "
            f"| {_mib(r['probe_peak_bytes'])} | {_mib(before) if before else '-'} "
            f"| {_mib(r['long_peak_bytes'])} | {r['ratio']:.3f} | {r['growth']:+.1%} "
            f"| {r['headroom_needed']:.1%} | {rises} | {r['wall_s']:.0f} s |"
        )
    return "\n".join(lines)


def conclusion(f: dict[str, Any]) -> str:
    """Whether the default headroom covers the largest growth seen, in the figures."""
    headroom = f["headroom_default"]
    worst = max(f["rows"], key=lambda r: r["ratio"])
    edge = worst["ratio"] * (1 - headroom)  # its long run's peak / budget, probed at the edge
    rises = {event: sum(r["grew_bytes"][event] for r in f["rows"]) for event in LATER}
    said = (
        f"The largest growth was {worst['config']}'s: its long run peaked at "
        f"{_mib(worst['long_peak_bytes'])}, {worst['growth']:+.1%} over its probe's "
        f"{_mib(worst['probe_peak_bytes'])} (ratio {worst['ratio']:.3f}), which needs a "
        f"headroom of {worst['headroom_needed']:.1%} of the budget. A config probed right "
        f"at the fit limit, budget x {1 - headroom:.2f}, would have peaked at {edge:.1%} "
        f"of the budget in such a run, so the default headroom of {headroom:.0%} "
    )
    if worst["headroom_needed"] <= headroom:
        said += f"covers it, with {1 - edge:.1%} of the budget to spare."
    else:
        said += (
            f"does not cover it: the run would go {edge - 1:.1%} of the budget over; "
            f"{worst['headroom_needed']:.1%} would."
        )
    return f"{said} {_where(f, rises)}"


def _where(f: dict[str, Any], rises: dict[str, int]) -> str:
    """Which of the long runs' events after their first steps raised their peaks."""
    runs, first = len(f["rows"]), f["eval_steps"]
    if not any(rises.values()):
        return f"After their first {first} steps, nothing in the {runs} runs raised their peaks."
    most = max(rises, key=lambda e: rises[e])
    parts = ", ".join(f"{LATER[e]} {_mib(b)}" for e, b in rises.items())
    return (
        f"After their first {first} steps, the {runs} runs' peaks rose most in the "
        f"{LATER[most]} ({parts}, summed over the runs)."
    )


def markdown(o: argparse.Namespace, f: dict[str, Any]) -> str:
    return (
        f"\n## The long run: a probe's peak against {o.steps} real steps with evaluations "
        f"and saves ({f['date']}, cpu)\n\n"
        f"`{f['command']}` on {f['machine']} ({f['versions']}). {f['shape']}, "
        f"{o.precisions} x {o.optimizers}, no checkpointing, budget {o.budget}. One "
        f"`autotune search` ({f['search_wall_s']:.0f} s, {len(f['probed'])} probes, "
        f"`--parity off --no-rehearse --confirm-top 0`); then {len(f['rows'])} of its "
        f"fitting configs each trained {o.steps} optimizer steps in a real Trainer run "
        f"with the trial's training arguments, evaluating {o.eval_samples} held-out "
        f"samples every {o.eval_steps} steps (the Trainer's default eval batch, loss only) "
        f"and saving a checkpoint every {o.save_steps}, on worst-case-length data as the "
        f"probe's, with no RLIMIT_DATA. Peaks are the processes' peak resident sets; "
        f"growth and the headroom it needs are long / probe - 1 and 1 - probe / long; the "
        f"rises after the first {o.eval_steps} steps credit each rise of the long run's "
        f"peak to the event during which it happened.\n\n{table(o, f['rows'])}\n\n{conclusion(f)}\n"
    )


def command(o: argparse.Namespace) -> str:
    """The command line that measured these figures: the options not at their default."""
    defaults = vars(parser().parse_args([]))
    changed = [
        f"--{k.replace('_', '-')} {v}"
        for k, v in vars(o).items()
        if k != "append" and v != defaults[k]
    ]
    return " ".join(["python benchmarks/long_run.py", *changed])


def _mib(n: int | float) -> str:
    return f"{n / 2**20:.0f} MiB"


if __name__ == "__main__":
    main()
