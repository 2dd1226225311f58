"""A grid's truth to a stated precision: its contenders timed in interleaved rounds.

Timing one config several times back to back measures the host's spell as much as the
config: on a 2-core VM a slow minute made one config look 25% faster than another it
ties. Here every round times each contender once (odd rounds in reverse order, so a
steady drift favours no position) and each config is compared with the best round by
round. Its ratio to the best is the geometric mean of the paired ratios, with a 95%
confidence interval (Student's t over the rounds). A config whose interval reaches 1
is tied with the best; one whose interval still reaches 1 while its estimate is more
than `RESOLVE` below it is timed in more rounds, beside the best, until the interval
separates or `MAX_ROUNDS` is reached, when it is declared a tie.

Rounds timed on another day are pooled with a grid's recorded ones: a host's state lasts
longer than one measurement, so two days' rounds state a precision that one day's
cannot (families, t5 with memory binding: Adafactor at 0.937 of fused AdamW, +-0.8%,
in five rounds of 2026-11-24; level with it in six rounds of a later session).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from autotune.core.stats import t_quantile

K = TypeVar("K", bound=Hashable)
ROUNDS = 5
MAX_ROUNDS = 8
RESOLVE = 0.02  # a tie this far below the best is worth more rounds to settle


Rounds = dict[int, float]  # round number -> samples/s (0: did not fit or failed)


@dataclass(frozen=True)
class Truth(Generic[K]):
    runs: dict[K, Rounds]
    best: K  # the config the paired ratios put first
    ratios: dict[K, float]  # geometric mean of the paired ratios to the best
    half_widths: dict[K, float]  # of the 95% interval, relative (0.03: +-3%)
    ties: list[K]  # interval reaches 1 (the best included)

    def score(self, key: K) -> float:
        """What finding `key` is worth: 1 for a tie, else its ratio to the best."""
        return 1.0 if key in self.ties else min(1.0, self.ratios.get(key, 0.0))


def round_ratio(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """`a` over `b` timed in the same rounds: the geometric mean of the round-by-round
    ratios, with its 95% interval (0s where neither ran; rounds where one did not are
    left out)."""
    logs = [math.log(x / y) for x, y in zip(a, b, strict=True) if x and y]
    if not logs:
        return 0.0, 0.0, 0.0
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.exp(mean), math.exp(mean)
    # a grid's rounds are read once, when all have run: one look's 95%
    half = t_quantile(0.05, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def interleaved(probe: Callable[[K], float], keys: Sequence[K], runs: dict[K, Rounds]) -> None:
    """One more round: every key timed once, in reverse order on odd rounds."""
    number = 1 + max((r for k in runs for r in runs[k]), default=-1)
    for key in keys if number % 2 == 0 else list(reversed(keys)):
        runs.setdefault(key, {})[number] = probe(key)


def paired(runs: dict[K, Rounds]) -> Truth[K]:
    """The truth the interleaved runs tell: each config against the best, round by round.
    The best is the config the paired ratios put first: medians alone still favour the
    config a drifting host timed earlier in more rounds."""
    first = max(runs, key=lambda k: (statistics.median(runs[k].values()), -len(runs[k])))
    around = _against(runs, first)
    best = max(runs, key=lambda k: (around.ratios[k], k == first))
    return around if best == first else _against(runs, best)


def _against(runs: dict[K, Rounds], best: K) -> Truth[K]:
    ratios, halves, ties = {best: 1.0}, {best: 0.0}, [best]
    for key, speeds in runs.items():
        if key == best:
            continue
        logs = [
            math.log(speed / runs[best][r])
            for r, speed in speeds.items()
            if speed > 0 and runs[best].get(r, 0) > 0
        ]
        if len(logs) < 2:  # no interval: a config that never ran is 0, never a tie
            ratios[key] = math.exp(statistics.mean(logs)) if logs else 0.0
            halves[key] = math.inf if logs else 0.0
            continue
        mean = statistics.mean(logs)
        half = t_quantile(0.05, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        ratios[key], halves[key] = math.exp(mean), math.expm1(half)
        if mean + half >= 0:
            ties.append(key)
    return Truth(runs, best, ratios, halves, ties)


def measure(
    probe: Callable[[K], float],
    keys: Sequence[K],
    before: dict[K, Rounds] | None = None,
    rounds: int = ROUNDS,
) -> Truth[K]:
    """`rounds` interleaved rounds of `keys`, then more rounds for unsettled ties (up to
    `MAX_ROUNDS` of them); added to the rounds `before` (another day's), pooled."""
    runs: dict[K, Rounds] = {k: dict(v) for k, v in (before or {}).items()}
    start = {k: len(v) for k, v in runs.items()}
    for _ in range(rounds):
        interleaved(probe, keys, runs)
    while True:
        truth = paired(runs)
        unsettled = [
            k
            for k in truth.ties
            if k != truth.best
            and truth.ratios[k] < 1 - RESOLVE
            and len(runs[k]) - start.get(k, 0) < MAX_ROUNDS
        ]
        if not unsettled:
            return truth
        # The best is timed beside them: a pair is only fair within one round.
        interleaved(probe, [truth.best, *unsettled], runs)
