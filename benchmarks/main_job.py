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
best round by round. It is measured once and kept in main_job.json with the date and
versions; each run's picks are scored against it where they are in it (a tie with the
best scores 1).

    python benchmarks/main_job.py --grid     # the grid, alone on the machine (37 min here)
    python benchmarks/main_job.py --runs 1   # both commands, timed and compared (about
                                             # 12 min a run), scored, appended
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
# The README's main job until 2026-11-26: the workload, and flags fit by hand to a 4.5
# minute search, which the time budget now plans
TUNED = [
    "--model",
    "google/mt5-small",
    "--global-batch-size",
    "16",
    "--seq-len",
    "64",
    "--target-len",
    "16",
    "--measure-steps",
    "3",
    "--time-budget",
    "4m30s",
    "--parity",
    "quick",
    "--lever",
    "torch_compile=false",
    "--lever",
    "attn_implementation=sdpa",
]
# Flags that do not change the space: a grid stays the truth of a command that differs
# only in these
NOT_SPACE = (
    "--study",
    "--time-budget",
    "--max-trials",
    "--parity",
    "--parity-steps",
    "--confirm-top",
    "--confirm-steps",
    "--warmup-steps",
    "--measure-steps",
    "--quiet",
    "--format",
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


def spec_study(work: Path) -> StudyStore:
    """A study the tuned command's flags created (one probe), whose stored spec is the space."""
    flags = [
        *without(TUNED, NOT_SPACE),
        "--max-trials",
        "1",
        "--parity",
        "off",
        "--confirm-top",
        "0",
    ]
    done = autotune(work, "search", "--study", "grid", *flags, "--quiet")
    if done.returncode != 0:
        raise SystemExit(f"the tuned command's flags did not make a study:\n{done.stderr}")
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
        "progress": done.stderr.splitlines()[-60:],
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
    against = truth.best
    other = "readme" if against == "tuned" else "tuned"
    readme_ratio = truth.ratios["readme"] / truth.ratios["tuned"]
    return {
        "same_config": False,
        "ratio": round(readme_ratio, 4),
        "half_width": round(truth.half_widths[other], 4),
        "tie": other in truth.ties,
        "rounds": {k: [round(v[r], 3) for r in sorted(v)] for k, v in truth.runs.items()},
    }


def picked(work: Path) -> Candidate:
    """The config the search in `work` exported: its study's record of the export's
    settings (the sidecar names the trial)."""
    sidecar = json.loads((work / "studies" / "main.best.summary.json").read_text())
    store = StudyStore.load(url=f"sqlite:///{work}/studies/autotune.db", name="main")
    number = sidecar["best"]["trial"]
    return next(r.candidate for r in store.records() if r.number == number)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", action="store_true", help="measure the grid into main_job.json")
    parser.add_argument("--runs", type=int, default=1, help="times to run the two commands")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.grid:
            FIXTURE.write_text(json.dumps(measure_grid(Path(tmp)), indent=2) + "\n")
            print(f"wrote {FIXTURE}")
            return
    if not FIXTURE.exists():
        sys.exit("no grid recorded: run `python benchmarks/main_job.py --grid` first")
    grid = json.loads(FIXTURE.read_text())
    if grid["flags"] != without(TUNED, NOT_SPACE):
        sys.exit("the tuned command changed since the grid was measured: measure it again")
    for number in range(args.runs):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            folders = {"readme": Path(a), "tuned": Path(b)}
            order = ["readme", "tuned"] if number % 2 == 0 else ["tuned", "readme"]
            runs = {
                k: timed_search(folders[k], readme_main_job() if k == "readme" else TUNED)
                for k in order
            }
            compared = side_by_side(folders["readme"], folders["tuned"])
        for run in runs.values():
            run["ratio_to_grid"] = round(ratio(run["selected"], grid), 3)
        record = {
            "date": machine()["date"],
            "flags": readme_main_job(),
            **runs,
            "readme_vs_tuned": compared,
        }
        shown = {
            k: ({f: v for f, v in r.items() if f != "progress"} if isinstance(r, dict) else r)
            for k, r in record.items()
        }
        print(json.dumps(shown), flush=True)
        grid["runs"].append(record)
        FIXTURE.write_text(json.dumps(grid, indent=2) + "\n")


if __name__ == "__main__":
    main()
