#!/usr/bin/env python
"""How often does the duel change the user's arithmetic for a gain that is not there, and
how often does it confirm one that is?

A change of precision or optimizer that parity did not verify is exported only on a
significant gain over the best config keeping the recipe's arithmetic, in paired rounds
(DESIGN invariant 9). The duel (tuning/confirming.duel) reads the rounds' interval after
every round and stops once it decides, so its error rates are not the single interval's
2.5% one way. Here the real duel and the real selection run on two records, the fp32
recipe and a bf16 change `gain` times as fast, whose rounds are drawn: each round's log
ratio of their step times is normal around the gain's, its sd `swing` (this project's
2-core hosts: 0.04-0.11, read from interleaved rounds of one config). Each duel starts
from one probe of each, as a search's confirmation does, and ends as the search's would;
what selection then exports is counted. No process is launched: a cell of 2000 duels
takes seconds.

    python benchmarks/duel_errors.py              # 2000 duels a cell
    python benchmarks/duel_errors.py --quick      # 100 duels a cell
    # the rule as it was at another commit, through its code on the path
    git worktree add /tmp/before bfd2216
    PYTHONPATH=/tmp/before python benchmarks/duel_errors.py
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import random
import statistics
from pathlib import Path
from typing import Any

from harness import Benchmark, Figures, header, run, table

import autotune
from autotune.core.device import DeviceInfo
from autotune.core.space import SearchSpace
from autotune.core.spec import SearchSpec
from autotune.core.trial import ModelSpec, Outcome, TrialRecord, TrialResult
from autotune.tuning import confirming
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.tuning.selection import select_for

GAINS = (1.0, 1.05, 1.10, 1.15)
SWINGS = (0.06, 0.11)
SPACE = SearchSpace(16, (8, 16), (), ("fp32", "bf16"), (False,), ("adamw_torch",))
SPEC = SearchSpec(
    model=ModelSpec("duel", "local", "causal-lm", {"model_type": "gpt2"}),
    device=DeviceInfo("cpu", None, "a host of drawn rounds", 16 * 2**30),
    space=SPACE,
    seq_len=128,
    target_len=0,
    memory_budget_bytes=8 * 2**30,
    recipe_settings={"optim": "adamw_torch"},
)
RECIPE, CHANGE = (
    SPACE.candidate(8, "fp32", False, "adamw_torch"),
    SPACE.candidate(8, "bf16", False, "adamw_torch"),
)


class Rounds:
    """The duel's store: two records, and the rounds it adds to them, drawn."""

    def __init__(self, gain: float, swing: float, rng: random.Random) -> None:
        self.gain, self.swing, self.rng = gain, swing, rng
        self.by_number = {0: self._probe(0, RECIPE, 1.0), 1: self._probe(1, CHANGE, 1 / gain)}
        self.numbers = itertools.count(1)

    def _probe(self, number: int, candidate: Any, step_s: float) -> TrialRecord:
        """One probe's steps: a spell of its own on the step time, five steps about it."""
        spell = step_s * math.exp(self.rng.gauss(0.0, self.swing / math.sqrt(2)))
        steps = tuple(spell * math.exp(self.rng.gauss(0.0, 0.02)) for _ in range(5))
        result = TrialResult(
            Outcome.OK,
            samples_per_s=16 / statistics.median(steps),
            peak_memory_bytes=2**30,
            step_times_s=steps,
            step_time_median_s=statistics.median(steps),
        )
        return TrialRecord(number, candidate, result)

    def records(self) -> list[TrialRecord]:
        return list(self.by_number.values())

    def next_round(self) -> int:
        return next(self.numbers)

    def run(self, record: TrialRecord, number: int) -> None:
        """A confirmation run in round `number`: the round's step time, each config's
        half of the round's swing its own."""
        truth = 1.0 if record.number == 0 else 1 / self.gain
        step_s = truth * math.exp(self.rng.gauss(0.0, self.swing / math.sqrt(2)))
        old = self.by_number[record.number]
        self.by_number[record.number] = dataclasses.replace(
            old, rounds=(*old.rounds, (number, step_s))
        )


@dataclasses.dataclass
class Duel:
    """What confirming.duel reads of the search run."""

    store: Rounds
    limits: SearchLimits
    spec: SearchSpec = SPEC

    @property
    def observer(self) -> Duel:
        return self

    def on_plan(self, line: str) -> None:
        pass


def duels(gain: float, swing: float, n: int, limits: SearchLimits, seed: int) -> Figures:
    """`n` duels at one cell: how often the change is exported, and the rounds run."""
    rng = random.Random(f"{gain}|{swing}|{seed}")
    changed, rounds = 0, []
    original = confirming.confirm_run
    # a confirmation run is one more drawn round of the duel's own store
    confirming.confirm_run = lambda run, record, number, runs: run.store.run(record, number)  # type: ignore[assignment,misc]
    try:
        for _ in range(n):
            store = Rounds(gain, swing, rng)
            runs = confirming.duel(Duel(store, limits), Deadline(None))  # type: ignore[arg-type]
            chosen = select_for(SPEC, store.records())
            changed += chosen is not None and chosen.candidate == CHANGE
            rounds.append(runs / 2)
    finally:
        confirming.confirm_run = original
    return {
        "gain": gain,
        "swing": swing,
        "changed": round(changed / n, 4),
        "rounds": round(statistics.mean(rounds), 2),
    }


def measure(args: argparse.Namespace, work: Path) -> Figures:
    n = 100 if args.quick else args.duels
    limits = SearchLimits(confirm_top=1, confirm_rounds=args.confirm_rounds)
    cells = [duels(g, s, n, limits, args.seed) for s in SWINGS for g in GAINS]
    return {
        "autotune_from": str(Path(autotune.__file__).parent),
        "duels": n,
        "confirm_rounds": args.confirm_rounds,
        "cells": cells,
    }


def report(f: Figures) -> str:
    text = header(f, "How often the duel changes the arithmetic, by the true gain")
    text += (
        f"\n{f['duels']} duels a cell, --confirm-rounds {f['confirm_rounds']}; autotune from "
        f"`{f['autotune_from']}`. Cells: the share of duels after which the bf16 change is "
        "exported (at a gain of 1.0: a change the gain does not pay for), and the mean "
        "paired rounds run.\n\n"
    )
    rows = [
        (
            f"{swing:.2f}",
            *(f"{c['changed']:.3f} ({c['rounds']:.1f})" for c in f["cells"] if c["swing"] == swing),
        )
        for swing in SWINGS
    ]
    return text + table(("rounds' swing (sd of log)", *(f"gain {g:.2f}" for g in GAINS)), rows)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duels", type=int, default=2000, help="duels a cell")
    parser.add_argument("--confirm-rounds", type=int, default=8, help="the search's default")
    parser.add_argument("--seed", type=int, default=0)


if __name__ == "__main__":
    run(Benchmark("duel_errors", __doc__, measure, report, options))
