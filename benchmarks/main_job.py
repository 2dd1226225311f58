#!/usr/bin/env python
"""The README's main job: timed whole, and scored against an exhaustive grid of its space.

The grid is the search's own space (read back from a study the main job's flags
created), every config probed once under the search's limit with the search's own
probe (fork server, the model built once), `GRID_MEASURE` timed steps each; then the
contenders (a first run within `NEAR` of the best's) are timed again in interleaved
rounds and paired with the best round by round (_truth: a ratio with a 95% interval; a
tie when it reaches 1). It is measured once and kept in main_job.json with the date and
versions; a run of the main job is scored against it (a tie with the best scores 1).

    python benchmarks/main_job.py --grid     # the grid, alone on the machine (37 min here)
    python benchmarks/main_job.py --runs 3   # the README's first command as written, timed
                                             # (about 4.5 min a run), scored, appended
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import HERE, autotune, machine, readme_main_job
from _truth import Truth, measure
from search_efficiency import score

from autotune.core.trial import Candidate, TrialResult
from autotune.launch.forkserver import model_to_share
from autotune.launch.runner import Launcher
from autotune.store.store import StudyStore
from autotune.tuning.limits import SearchLimits
from autotune.tuning.run import SearchRun

FIXTURE = HERE / "main_job.json"
GRID_MEASURE = 5  # timed steps of a grid run (the search's probes time 1 to 5)
GRID_WARMUP = 2
NEAR = 0.2  # a config whose first run comes this close to the best's is a contender
# Flags that do not change the space: a grid stays the truth of a command that differs
# only in these
NOT_SPACE = ("--study", "--time-budget", "--max-trials", "--parity", "--parity-steps",
             "--confirm-top", "--confirm-steps", "--warmup-steps", "--measure-steps", "--quiet",
             "--format")  # fmt: skip


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
            store=store, study_dir=work, limits=SearchLimits(), observer=None,  # type: ignore[arg-type]
            launcher=launcher,
        )  # fmt: skip
        self.count = 0

    def __call__(self, c: Candidate) -> TrialResult:
        self.count += 1
        config = self.run.trial_config(10_000 + self.count, c, f"grid-{self.count}",
                                       measure_steps=GRID_MEASURE)  # fmt: skip
        config = dataclasses.replace(config, warmup_steps=GRID_WARMUP)
        return self.run.launcher.run(config, timeout_s=600)

    def speed(self, c: Candidate) -> float:
        return score(self(c), self.spec.fit_limit_bytes)

    def close(self) -> None:
        self.run.launcher.close()


def spec_study(work: Path) -> StudyStore:
    """A study the README's flags created (one probe), whose stored spec is the space."""
    flags = [*without(readme_main_job(), NOT_SPACE), "--max-trials", "1", "--parity", "off",
             "--confirm-top", "0"]  # fmt: skip
    done = autotune(work, "search", "--study", "grid", *flags, "--quiet")
    if done.returncode != 0:
        raise SystemExit(f"the main job's flags did not make a study:\n{done.stderr}")
    return StudyStore.load(url=f"sqlite:///{work}/studies/autotune.db", name="grid")


def measure_grid(work: Path) -> dict[str, Any]:
    started = time.monotonic()
    store = spec_study(work)
    prober = GridProber(store, work)
    try:
        configs = list(store.spec.space.candidates(include_fallback=False))
        first: dict[str, float] = {}
        by_label: dict[str, Candidate] = {}
        for c in configs:
            by_label[c.describe()] = c
            first[c.describe()] = prober.speed(c)
            print(f"  {c.describe()}: {first[c.describe()]:.2f} samples/s", flush=True)
        top = max(first.values())
        near = [k for k, s in first.items() if top > 0 and s >= (1 - NEAR) * top]
        print(f"contenders: {near}", flush=True)
        truth: Truth[str] = measure(lambda k: prober.speed(by_label[k]), near)
    finally:
        prober.close()
    return {
        **machine(),
        "flags": without(readme_main_job(), NOT_SPACE),
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
        "runs": [],
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


def main_job(work: Path) -> dict[str, Any]:
    """The README's first command as written (its study name replaced), timed whole."""
    started = time.monotonic()
    done = autotune(work, "search", "--study", "main", *readme_main_job(), "--format", "json")
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"the main job failed:\n{done.stderr[-2000:]}")
    out = json.loads(done.stdout)
    return {
        "wall_s": round(wall, 1),
        "selected": out["best"]["config"],
        "samples_per_s": round(out["best"]["samples_per_s"] or 0.0, 3),
        "probes": out["probes_this_run"],
        "stop_reason": out["stop_reason"],
        "parity": out["parity"] and out["parity"].get("verdict"),
        "progress": done.stderr.splitlines()[-60:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", action="store_true", help="measure the grid into main_job.json")
    parser.add_argument("--runs", type=int, default=1, help="times to run the main job")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.grid:
            FIXTURE.write_text(json.dumps(measure_grid(Path(tmp)), indent=2) + "\n")
            print(f"wrote {FIXTURE}")
            return
    if not FIXTURE.exists():
        sys.exit("no grid recorded: run `python benchmarks/main_job.py --grid` first")
    grid = json.loads(FIXTURE.read_text())
    if grid["flags"] != without(readme_main_job(), NOT_SPACE):
        sys.exit("the README's main job changed since the grid was measured: measure it again")
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            run = main_job(Path(tmp))
        run["ratio"] = round(ratio(run["selected"], grid), 3)
        run["date"] = machine()["date"]
        print(json.dumps({k: v for k, v in run.items() if k != "progress"}), flush=True)
        grid["runs"].append(run)
        FIXTURE.write_text(json.dumps(grid, indent=2) + "\n")


if __name__ == "__main__":
    main()
