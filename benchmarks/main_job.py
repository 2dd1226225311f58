#!/usr/bin/env python
"""The README's main job: timed whole, beside the command tuned by hand it replaced, and
scored against an exhaustive grid of that command's space.

The README's main job gives only the workload and `--time-budget 5m`: the budget plans
the rest. `TUNED` is the command it replaced, whose extra flags were chosen by hand to
fit its search into 4.5 minutes (3 timed steps, a 4-step parity check, compile and
attention fixed). Each run times both, in fresh folders (so neither reuses the other's
probes), then times the two selected configs in interleaved rounds with the search's
own probe (`_truth`: a ratio with a 95% interval; a tie when it reaches 1): the
README's job must pick as well as the tuned command.

The grid is `TUNED`'s space (read back from a study its flags created), every config
probed once under the search's limit with the search's own probe (fork server, the
model built once), `GRID_MEASURE` timed steps each; then the contenders (a first run
within `NEAR` of the best's) are timed again in interleaved rounds and paired with the
best round by round. It is measured once and kept in main_job_grid.json with the date
and versions; each run's picks are scored against it (a tie with the best scores 1).

    python benchmarks/main_job.py --grid --record   # the grid, alone (37 min here)
    python benchmarks/main_job.py --record          # both commands, timed, compared and
                                                    # scored (about 12 min a run)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from _truth import Truth, measure
from harness import (
    HERE,
    Benchmark,
    Figures,
    autotune,
    header,
    readme_main_job,
    run,
    score,
    stamp,
    table,
)

from autotune.core.trial import Candidate, TrialResult
from autotune.launch.forkserver import model_to_share
from autotune.launch.runner import Launcher
from autotune.store.store import StudyStore
from autotune.tuning.limits import SearchLimits
from autotune.tuning.run import SearchRun

FIXTURE = HERE / "main_job_grid.json"
GRID_MEASURE = 5  # timed steps of a grid run (the search's probes time 1 to 5)
GRID_WARMUP = 2
NEAR = 0.2  # a config whose first run comes this close to the best's is a contender
# The README's main job until 2026-11-26: the workload, and flags fit by hand to a 4.5
# minute search, which the time budget now plans
TUNED = [
    *("--model", "google/mt5-small", "--global-batch-size", "16"),
    *("--seq-len", "64", "--target-len", "16", "--measure-steps", "3"),
    *("--time-budget", "4m30s", "--parity", "quick"),
    *("--lever", "torch_compile=false", "--lever", "attn_implementation=sdpa"),
]
# Flags that do not change the space: a grid stays the truth of a command that differs
# only in these
NOT_SPACE = (
    *("--study", "--time-budget", "--max-trials", "--parity", "--parity-steps"),
    *("--confirm-top", "--confirm-steps", "--warmup-steps", "--measure-steps"),
    *("--quiet", "--format"),
)


def without(flags: list[str], names: tuple[str, ...]) -> list[str]:
    """`flags` less the named options and their values."""
    kept: list[str] = []
    skip = False
    for word in flags:
        if skip:
            skip = False
        elif word in names:
            skip = word not in ("--quiet",)
        else:
            kept.append(word)
    return kept


class GridProber:
    """Probes the configs of a study's space exactly as its search would, fixed windows."""

    def __init__(self, store: StudyStore, work: Path) -> None:
        self.spec = store.spec
        launcher = Launcher(
            self.spec.device.kind, work / "forkserver.log", shared=model_to_share(self.spec, 1)
        )
        self.run = SearchRun(
            store=store,
            study_dir=work,
            limits=SearchLimits(),
            observer=None,  # type: ignore[arg-type]
            launcher=launcher,
        )
        self.count = 0

    def __call__(self, c: Candidate) -> TrialResult:
        self.count += 1
        config = self.run.trial_config(
            10_000 + self.count, c, f"grid-{self.count}", measure_steps=GRID_MEASURE
        )
        config = dataclasses.replace(config, warmup_steps=GRID_WARMUP)
        return self.run.launcher.run(config, timeout_s=600)

    def speed(self, c: Candidate) -> float:
        return score(self(c), self.spec.fit_limit_bytes)

    def close(self) -> None:
        self.run.launcher.close()


def measure_grid(work: Path) -> dict[str, Any]:
    """The tuned command's space (from a study its flags created, one probe), each config
    once, then the contenders in interleaved rounds."""
    started = time.monotonic()
    flags = [*without(TUNED, NOT_SPACE), "--max-trials", "1", "--parity", "off"]
    done = autotune(work, "search", "--study", "grid", *flags, "--confirm-top", "0", "--quiet")
    if done.returncode != 0:
        raise SystemExit(f"the tuned command's flags did not make a study:\n{done.stderr}")
    store = StudyStore.load(url=f"sqlite:///{work}/studies/autotune.db", name="grid")
    prober = GridProber(store, work)
    try:
        configs = {c.describe(): c for c in store.spec.space.candidates(include_fallback=False)}
        first = {k: prober.speed(c) for k, c in configs.items()}
        print(first, flush=True)
        top = max(first.values())
        near = [k for k, s in first.items() if top > 0 and s >= (1 - NEAR) * top]
        truth: Truth[str] = measure(lambda k: prober.speed(configs[k]), near)
    finally:
        prober.close()
    return {
        "flags": without(TUNED, NOT_SPACE),
        "space": len(configs),
        "grid_steps": {"warmup": GRID_WARMUP, "measured": GRID_MEASURE},
        "near": NEAR,
        "wall_s": round(time.monotonic() - started, 1),
        "first_pass": {k: round(v, 3) for k, v in first.items()},
        "truth": {
            "best": truth.best,
            "ties": truth.ties,
            "ratios": {k: round(v, 4) for k, v in truth.ratios.items()},
            "half_widths": {k: round(v, 4) for k, v in truth.half_widths.items()},
            "rounds": {k: [round(v[r], 3) for r in sorted(v)] for k, v in truth.runs.items()},
        },
    }


def ratio(found: str, grid: dict[str, Any]) -> float:
    """What the selected config is worth against the grid: 1 for a tie with the best, a
    contender's paired ratio, else its first-pass speed over the best contender's."""
    truth = grid["truth"]
    if found in truth["ties"]:
        return 1.0
    if found in truth["ratios"]:
        return float(truth["ratios"][found])
    best = statistics.median(truth["rounds"][truth["best"]])
    return min(1.0, grid["first_pass"].get(found, 0.0) / best)


def timed_search(work: Path, flags: list[str]) -> dict[str, Any]:
    """One search as a user types it (its study named "main"), timed whole."""
    started = time.monotonic()
    done = autotune(work, "search", "--study", "main", *flags, "--format", "json")
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(flags)} failed:\n{done.stderr[-2000:]}")
    out = json.loads(done.stdout)
    return {
        "wall_s": round(wall, 1),
        "selected": out["best"]["config"],
        "samples_per_s": round(out["best"]["samples_per_s"] or 0.0, 3),
        "probes": out["probes_this_run"],
        "stop_reason": out["stop_reason"],
        "parity": out["parity"] and out["parity"].get("verdict"),
    }


def side_by_side(readme: Path, tuned: Path) -> dict[str, Any]:
    """The two picks timed in interleaved rounds by the search's own probe (the README
    job's study and limit): the README pick's ratio to the tuned pick, with its 95%
    interval."""
    picks = {"readme": picked(readme), "tuned": picked(tuned)}
    if picks["readme"] == picks["tuned"]:
        return {"same_config": True, "ratio": 1.0, "half_width": 0.0, "tie": True}
    store = StudyStore.load(url=f"sqlite:///{readme}/studies/autotune.db", name="main")
    prober = GridProber(store, readme / "side-by-side")
    try:
        truth: Truth[str] = measure(lambda k: prober.speed(picks[k]), list(picks))
    finally:
        prober.close()
    other = "readme" if truth.best == "tuned" else "tuned"
    return {
        "same_config": False,
        "ratio": round(truth.ratios["readme"] / truth.ratios["tuned"], 4),
        "half_width": round(truth.half_widths[other], 4),
        "tie": other in truth.ties,
        "rounds": {k: [round(v[r], 3) for r in sorted(v)] for k, v in truth.runs.items()},
    }


def picked(work: Path) -> Candidate:
    """The config the search in `work` exported (the sidecar names its trial)."""
    sidecar = json.loads((work / "studies" / "main.best.summary.json").read_text())
    store = StudyStore.load(url=f"sqlite:///{work}/studies/autotune.db", name="main")
    return next(r.candidate for r in store.records() if r.number == sidecar["best"]["trial"])


def measure_runs(args: argparse.Namespace, work: Path) -> Figures:
    if args.grid:
        grid = {**stamp(), **measure_grid(work)}
        if args.record:
            FIXTURE.write_text(json.dumps(grid, indent=2) + "\n")
        return {"grid": grid}
    grid = json.loads(FIXTURE.read_text())
    if grid["flags"] != without(TUNED, NOT_SPACE):
        raise SystemExit("the tuned command changed since the grid was measured: --grid again")
    runs = []
    for number in range(args.runs):
        folders = {"readme": work / f"readme-{number}", "tuned": work / f"tuned-{number}"}
        timed = {}
        for way in ("readme", "tuned") if number % 2 == 0 else ("tuned", "readme"):
            folders[way].mkdir()
            timed[way] = timed_search(folders[way], readme_main_job() if way == "readme" else TUNED)
            timed[way]["ratio_to_grid"] = round(ratio(timed[way]["selected"], grid), 3)
        runs.append({**timed, "readme_vs_tuned": side_by_side(folders["readme"], folders["tuned"])})
        print(json.dumps(runs[-1]), flush=True)
    return {"flags": readme_main_job(), "grid_date": grid["date"], "runs": runs}


def report(f: Figures) -> str:
    text = header(f, "The README's main job against the command tuned by hand")
    if "grid" in f:
        g = f["grid"]
        return text + (
            f"\nGrid of the tuned command's space: {g['space']} configs in {g['wall_s']:.0f} s; "
            f"best {g['truth']['best']}, {len(g['truth']['ties'])} tied.\n"
        )
    rows = []
    for r in f["runs"]:
        for way in ("readme", "tuned"):
            run_ = r[way]
            figures = (f"{run_['wall_s']:.0f} s", run_["probes"], run_["selected"])
            rows.append((way, *figures, run_["samples_per_s"], run_["ratio_to_grid"]))
        v = r["readme_vs_tuned"]
        rows.append(("readme / tuned", "", "", "", f"{v['ratio']} +-{v['half_width']:.1%}", ""))
    columns = ("command", "wall", "probes", "selected", "samples/s", "to the grid's best")
    return text + f"\nGrid of {f['grid_date']}.\n\n" + table(columns, rows)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grid", action="store_true", help="measure the grid (--record keeps it)")
    parser.add_argument("--runs", type=int, default=1, help="times to run the two commands")


if __name__ == "__main__":
    run(Benchmark("main_job", __doc__, measure_runs, report, options))
