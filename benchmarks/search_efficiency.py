#!/usr/bin/env python
"""Does the search find the best config in few probes? And what does a probe cost?

On this machine's CPU, with a small causal LM and a memory budget that makes part of
the space run out of memory, one run measures:

1. the exhaustive grid: every config probed once (the reference);
2. `autotune search` with its defaults (TPE + seeds + skip rules + confirmation) on a
   budget of 25% of the grid's probes, for real;
3. plain Optuna TPE and random search with the same trial budget, replayed on the
   grid's measurements (each proposal costs one trial, duplicates included), over
   several seeds;
4. the per-trial overhead, each phase, for a fresh interpreter per probe (before) and
   for the pre-imported fork server (after).

Every "found" config is scored by its grid measurement, so all methods are compared on
the same numbers. Prints the figures and appends them to benchmarks/RESULTS.md (and
writes benchmarks/search_efficiency.json).

    python benchmarks/search_efficiency.py           # about 12 minutes on 2 cores
    python benchmarks/search_efficiency.py --quick   # a smaller space, for CI
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from autotune.core.space import SearchSpace
from autotune.core.trial import Outcome, TrialConfig, TrialResult
from autotune.hf.models import resolve_model
from autotune.launch.forkserver import ForkServer
from autotune.launch.runner import run_trial
from autotune.system.devices import cpu_memory_bytes, cpu_name

HERE = Path(__file__).resolve().parent
MODEL = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_embd": 128,
    "n_layer": 4,
    "n_head": 4,
    "n_positions": 512,
    "vocab_size": 4096,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
MIB = 2**20


def settings(quick: bool) -> dict[str, object]:
    if quick:
        return {
            "global_batch": 32,
            "seq_len": 128,
            "budget_mib": 800,
            "precisions": ("fp32", "bf16"),
            "optimizers": ("adamw_torch", "adafactor"),
            "seeds": 2,
            "steps": (1, 2),
        }
    return {
        "global_batch": 32,
        "seq_len": 128,
        "budget_mib": 800,
        "precisions": ("fp32", "bf16", "fp16"),
        "optimizers": ("adamw_torch", "adamw_torch_fused", "adafactor"),
        "seeds": 5,
        "steps": (2, 3),
    }


def grid(
    space: SearchSpace, model_dir: Path, work: Path, s: dict[str, object]
) -> tuple[dict, float]:
    """Probe every config once; returns ({(batch, precision, ckpt, optim): result}, wall s)."""
    model = resolve_model(str(model_dir))
    budget = int(s["budget_mib"]) * MIB  # type: ignore[call-overload]
    warmup, measure = s["steps"]  # type: ignore[misc]
    server = ForkServer(work / "grid-forkserver.log", data_limit=budget)
    results: dict[tuple[int, str, bool, str], TrialResult] = {}
    started = time.monotonic()
    try:
        for n, c in enumerate(space.candidates()):
            config = TrialConfig(
                number=n,
                trial_dir=str(work / "grid" / str(n)),
                model=model,
                candidate=c,
                device="cpu",
                seq_len=int(s["seq_len"]),
                target_len=8,  # type: ignore[call-overload]
                memory_limit_bytes=budget,
                warmup_steps=warmup,
                measure_steps=measure,
            )
            results[
                (c.per_device_train_batch_size, c.precision, c.activation_checkpointing, c.optim)
            ] = run_trial(config, timeout_s=300, server=server)
    finally:
        server.close()
    return results, time.monotonic() - started


def score(result: TrialResult | None, limit: int) -> float:
    """A config's throughput if it ran cleanly within the limit, else 0."""
    if result is None or result.outcome != Outcome.OK or result.samples_per_s is None:
        return 0.0
    return result.samples_per_s if (result.peak_memory_bytes or 0) <= limit else 0.0


def plain(
    sampler_name: str, space: SearchSpace, table: dict, limit: int, trials: int, seed: int
) -> float:
    """Best grid score plain Optuna finds in `trials` proposals (duplicates cost a trial)."""
    sampler = (
        optuna.samplers.TPESampler(seed=seed)
        if sampler_name == "tpe"
        else optuna.samplers.RandomSampler(seed=seed)
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)

    def objective(trial: optuna.Trial) -> float:
        key = (
            trial.suggest_categorical("per_device_train_batch_size", list(space.all_batches)),
            trial.suggest_categorical("precision", list(space.precisions)),
            trial.suggest_categorical("activation_checkpointing", [False, True]),
            trial.suggest_categorical("optim", list(space.optimizers)),
        )
        return score(table.get(key), limit)

    study.optimize(objective, n_trials=trials)
    return max(t.value or 0.0 for t in study.trials)


def autotune_run(model_dir: Path, work: Path, s: dict[str, object], trials: int) -> dict:
    """The real CLI with its defaults, on the same model, space and budget."""
    warmup, measure = s["steps"]  # type: ignore[misc]
    argv = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        "--model",
        str(model_dir),
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
        "--precisions",
        ",".join(s["precisions"]),  # type: ignore[arg-type]
        "--optimizers",
        ",".join(s["optimizers"]),
        "--max-trials",
        str(trials),  # type: ignore[arg-type]
        "--warmup-steps",
        str(warmup),
        "--measure-steps",
        str(measure),
        "--quiet",
    ]
    started = time.monotonic()
    done = subprocess.run(
        argv,
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"autotune search failed:\n{done.stderr}")
    study = optuna.load_study(
        study_name=model_dir.name, storage=f"sqlite:///{work}/studies/autotune.db"
    )
    attrs = [t.user_attrs for t in study.trials]
    best = json.loads((work / "studies" / f"{model_dir.name}.best.json").read_text())
    key = (
        best["per_device_train_batch_size"],
        "bf16" if best["bf16"] else "fp16" if best["fp16"] else "fp32",
        best["activation_checkpointing"],
        best["optim"],
    )
    return {
        "wall_s": wall,
        "probes": sum(
            1 for a in attrs if a.get("outcome") not in (None, "skipped") and "confirms" not in a
        ),
        "confirmations": sum(1 for a in attrs if "confirms" in a),
        "skipped_launches": sum(1 for a in attrs if a.get("outcome") == "skipped"),
        "found": key,
    }


def overhead(model_dir: Path, work: Path, repeats: int = 3) -> dict[str, dict[str, float]]:
    """Mean seconds per phase of one probe, and its quickest step: a fresh interpreter, the
    fork server, and the fork server handing down the model it built (as a search does).
    The launches are interleaved, so that what slows the host slows each alike."""
    from autotune.core.trial import Candidate
    from autotune.probe.shared_model import SharedModel

    model = resolve_model(str(model_dir))
    candidate = Candidate(8, 1, "fp32", False, "adamw_torch")

    def config(mode: int, i: int) -> TrialConfig:
        return TrialConfig(
            number=i,
            trial_dir=str(work / "oh" / str(mode) / str(i)),
            model=model,
            candidate=candidate,
            device="cpu",
            seq_len=128,
            target_len=8,
            memory_limit_bytes=2**31,
            warmup_steps=2,
            measure_steps=3,
        )

    servers: dict[str, ForkServer | None] = {
        "fresh process (before)": None,
        "fork server (after)": ForkServer(work / "oh.log", data_limit=2**31),
        "fork server, model inherited": ForkServer(
            work / "oh-shared.log", data_limit=2**31, shared=SharedModel.of(model, 0, candidate)
        ),
    }
    runs: dict[str, list[TrialResult]] = {mode: [] for mode in servers}
    try:
        for i in range(repeats):
            for k, (mode, server) in enumerate(servers.items()):
                runs[mode].append(run_trial(config(k, i), timeout_s=300, server=server))
    finally:
        for server in servers.values():
            if server is not None:
                server.close()
    phases: dict[str, dict[str, float]] = {}
    for mode, results in runs.items():
        mean = {
            k: statistics.mean(r.phases_s.get(k, 0.0) for r in results) for k in results[0].phases_s
        }
        mean["start+teardown"] = mean["wall"] - mean["total"]
        mean["quickest_step"] = min(min(r.step_times_s) for r in results)
        phases[mode] = mean
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller space (CI smoke)")
    parser.add_argument("--no-append", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args()
    s = settings(args.quick)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = work / "bench-gpt2"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(MODEL))
        from autotune.core.space import batch_choices

        regular, fallback = batch_choices(int(s["global_batch"]))  # type: ignore[call-overload]
        space = SearchSpace(
            int(s["global_batch"]),
            regular,
            fallback,  # type: ignore[call-overload]
            tuple(s["precisions"]),
            (False, True),
            tuple(s["optimizers"]),
        )  # type: ignore[arg-type]
        limit = int(int(s["budget_mib"]) * MIB * 0.95)  # type: ignore[call-overload]
        table, grid_wall = grid(space, model_dir, work, s)
        grid_best = max(score(r, limit) for r in table.values())
        budget = max(1, len(table) // 4)
        tuned = autotune_run(model_dir, work, s, budget)
        seeds = int(s["seeds"])  # type: ignore[call-overload]
        baselines = {
            name: [
                plain(name, space, table, limit, budget, seed) / grid_best for seed in range(seeds)
            ]
            for name in ("tpe", "random")
        }
        costs = overhead(model_dir, work)
    figures = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, {cpu_memory_bytes() / 2**30:.0f} GiB",
        "python": platform.python_version(),
        "space": len(table),
        "budget_mib": s["budget_mib"],
        "trial_budget": budget,
        "grid": {
            "wall_s": round(grid_wall, 1),
            "best_samples_per_s": round(grid_best, 2),
            "oom": sum(r.outcome == Outcome.OOM for r in table.values()),
        },
        "autotune": {
            **tuned,
            "found_vs_grid_best": round(score(table[tuned["found"]], limit) / grid_best, 3),
            "probes_vs_grid": round(tuned["probes"] / len(table), 3),
            "wall_vs_grid": round(tuned["wall_s"] / grid_wall, 3),
        },
        "plain_tpe_vs_grid_best": [round(x, 3) for x in baselines["tpe"]],
        "random_vs_grid_best": [round(x, 3) for x in baselines["random"]],
        "overhead_s": {mode: {k: round(v, 3) for k, v in p.items()} for mode, p in costs.items()},
        "quick": args.quick,
    }
    figures["autotune"]["found"] = list(tuned["found"])
    print(json.dumps(figures, indent=2))
    if not args.no_append:
        (HERE / "search_efficiency.json").write_text(json.dumps(figures, indent=2) + "\n")
        with open(HERE / "RESULTS.md", "a", encoding="utf-8") as out:
            out.write(markdown(figures))


def markdown(f: dict) -> str:
    a, g = f["autotune"], f["grid"]
    tpe, rnd = f["plain_tpe_vs_grid_best"], f["random_vs_grid_best"]
    rows = "\n".join(
        f"| {mode} | "
        + " | ".join(
            f"{p.get(k, 0):.2f}"
            for k in (
                "start+teardown",
                "import",
                "build",
                "warmup",
                "measured_steps",
                "peak_flops",
                "wall",
                "quickest_step",
            )
        )
        + " |"
        for mode, p in f["overhead_s"].items()
    )
    return f"""
## Search efficiency ({f["date"]}{", quick" if f["quick"] else ""})

Machine: {f["machine"]}; Python {f["python"]}. Command: `python benchmarks/search_efficiency.py{" --quick" if f["quick"] else ""}`.
Space: {f["space"]} configs; budget {f["budget_mib"]} MiB (RLIMIT_DATA), {g["oom"]} of them OOM in the grid.
Trial budget for the searches: {f["trial_budget"]} ({f["trial_budget"] / f["space"]:.0%} of the grid).

| method | best found / grid best | probes / grid's | wall / grid's |
| --- | --- | --- | --- |
| exhaustive grid | 1.000 | 1.00 | 1.00 ({g["wall_s"]:.0f} s) |
| autotune search (defaults) | {a["found_vs_grid_best"]:.3f} | {a["probes_vs_grid"]:.2f} (+{a["confirmations"]} confirmations) | {a["wall_vs_grid"]:.2f} |
| plain TPE, same trials ({len(tpe)} seeds) | {statistics.mean(tpe):.3f} (min {min(tpe):.3f}) | {f["trial_budget"] / f["space"]:.2f} | replayed on the grid |
| random, same trials ({len(rnd)} seeds) | {statistics.mean(rnd):.3f} (min {min(rnd):.3f}) | {f["trial_budget"] / f["space"]:.2f} | replayed on the grid |

Launches the skip rules saved in the autotune run: {a["skipped_launches"]}.

Per-trial overhead, seconds (mean of 3 probes of one small config, the launches interleaved;\nthe quickest step is the least of their steps: an inherited model should match the others):

| launch | start+teardown | import | build | warm-up | measured steps | peak FLOP/s | wall | quickest step |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{rows}
"""


if __name__ == "__main__":
    main()
