"""The benchmarks' grid truth (benchmarks/_truth.py): what a drifting host cannot fake."""

from __future__ import annotations

import random
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from _truth import MAX_ROUNDS, ROUNDS, measure, paired


class Host:
    """Probes on a host whose speed falls by `drift` a probe, with `jitter` noise."""

    def __init__(self, speeds: dict[str, float], drift: float, jitter: float = 0.0) -> None:
        self.speeds, self.drift, self.jitter = speeds, drift, jitter
        self.factor, self.order = 1.0, []
        self.random = random.Random(0)

    def __call__(self, key: str) -> float:
        self.order.append(key)
        self.factor *= 1.0 - self.drift
        return self.speeds[key] * self.factor * (1 + self.random.uniform(-1, 1) * self.jitter)


def test_a_slowing_host_does_not_crown_the_config_timed_first() -> None:
    # Back to back, 'a' (timed first, on the faster host) would look 20% faster than 'b'.
    host = Host({"a": 100.0, "b": 103.0, "c": 80.0}, drift=0.04)
    back_to_back = {k: [host(k) for _ in range(ROUNDS)] for k in ("a", "b", "c")}
    assert sorted(back_to_back["a"])[2] > sorted(back_to_back["b"])[2]

    host = Host({"a": 100.0, "b": 103.0, "c": 80.0}, drift=0.04)
    truth = measure(host, ["a", "b", "c"])
    assert truth.best == "b"
    # Within 2% on a host 4% slower at every probe (back to back: 20% off).
    assert abs(truth.ratios["a"] - 100 / 103) < 0.02
    assert abs(truth.ratios["c"] - 80 / 103) < 0.02
    assert truth.score("c") < 0.8  # separated, scored by its ratio


def test_rounds_alternate_direction() -> None:
    host = Host({"a": 1.0, "b": 1.0}, drift=0.0)
    measure(host, ["a", "b"])
    assert host.order[:4] == ["a", "b", "b", "a"]


def test_a_close_call_is_a_tie_and_a_clear_gap_is_not() -> None:
    host = Host({"a": 100.0, "b": 99.5, "c": 85.0}, drift=0.01, jitter=0.03)
    truth = measure(host, ["a", "b", "c"])
    assert {"a", "b"} <= set(truth.ties)
    assert "c" not in truth.ties
    assert truth.score("a") == truth.score("b") == 1.0
    assert truth.half_widths[truth.best] == 0.0
    assert truth.half_widths["c"] < 0.1


def test_an_unsettled_tie_is_timed_again_beside_the_best_until_the_limit() -> None:
    # 'b' swings between 80% and 110% of 'a': about 9% slower, never separated.
    counts = {"a": 0, "b": 0, "c": 0}

    def probe(key: str) -> float:
        counts[key] += 1
        return {"a": 100.0, "b": (110.0, 80.0)[counts["b"] % 2], "c": 50.0}[key]

    truth = measure(probe, ["a", "b", "c"])
    assert truth.best == "a"
    assert truth.ratios["b"] < 0.95
    assert len(truth.runs["c"]) == ROUNDS  # separated: no more rounds
    assert len(truth.runs["b"]) == len(truth.runs["a"]) == MAX_ROUNDS
    assert "b" in truth.ties  # declared a tie at the limit


def test_a_config_that_never_fits_scores_zero_and_pairs_only_shared_rounds() -> None:
    truth = paired({"a": {0: 100.0, 1: 90.0, 2: 95.0}, "b": {0: 0.0, 1: 0.0}, "c": {1: 45.0}})
    assert truth.best == "a"
    assert truth.score("b") == 0.0 and "b" not in truth.ties
    assert truth.ratios["c"] == 0.5  # paired with round 1 alone, no interval: not a tie
    assert "c" not in truth.ties


def test_another_days_rounds_are_pooled_with_the_recorded_ones() -> None:
    """Day one timed 'b' at 0.94 of 'a', tightly; day two times them level. Pooled, 'b'
    sits between, its interval spanning both days' rounds; the new rounds are numbered
    after the recorded ones, and rounds to settle a tie are counted from day two."""
    day_one = {
        "a": {r: 100.0 for r in range(ROUNDS)},
        "b": {r: 94.0 + (r % 2) * 0.5 for r in range(ROUNDS)},
    }
    alone = paired(day_one)
    assert "b" not in alone.ties and alone.half_widths["b"] < 0.01
    host = Host({"a": 100.0, "b": 100.0}, drift=0.0, jitter=0.01)
    truth = measure(host, ["a", "b"], day_one)
    assert set(truth.runs["b"]) >= set(range(2 * ROUNDS))
    assert day_one["b"] == {r: 94.0 + (r % 2) * 0.5 for r in range(ROUNDS)}  # not changed
    assert 0.95 < truth.score("b") <= 1.0
    assert truth.half_widths["b"] > 3 * alone.half_widths["b"]
    assert len(truth.runs["a"]) <= ROUNDS + MAX_ROUNDS


def _grid(rounds: dict[tuple[int, str, bool, str], list[float]], extra: dict) -> dict:
    runs = {k: dict(enumerate(v)) for k, v in rounds.items()}
    scores = {k: sum(v) / len(v) for k, v in rounds.items()} | extra
    return {"scores": scores, "truth": paired(runs)}


def test_the_rules_best_is_the_best_keeping_config_unless_a_change_is_significant() -> None:
    """Families are scored against the best config the export rule may pick: a change of
    precision or optimizer only where the grid's paired rounds make its gain over the
    best arithmetic-keeping config significant (decision 1 of #68)."""
    from families import rule_best, rule_ratio

    keep, bf16, slow = (
        (8, "fp32", False, "adamw_torch"),
        (8, "bf16", False, "adafactor"),
        (
            16,
            "fp32",
            False,
            "adamw_torch_fused",
        ),
    )
    # bf16 Adafactor 3-9% faster round by round: significant, so the rule may pick it
    clear = _grid({keep: [100, 98, 101, 99], bf16: [106, 107, 105, 108]}, {slow: 50.0})
    assert rule_best(clear) == bf16
    assert rule_ratio(bf16, clear) == 1.0 and rule_ratio(keep, clear) < 0.95
    # a gain within the noise: the rule keeps the arithmetic, and finding keep is a 1
    noisy = _grid({keep: [100, 90, 101, 95], bf16: [97, 99, 104, 96]}, {slow: 50.0})
    assert noisy["truth"].best == bf16 and rule_best(noisy) == keep
    assert rule_ratio(keep, noisy) == 1.0
    assert rule_ratio(bf16, noisy) == 1.0  # tied with the rule's best in the rounds
    assert 0.45 < rule_ratio(slow, noisy) < 0.55  # outside the contenders: first pass
    assert rule_ratio(None, noisy) == 0.0
    # no config keeps the arithmetic that fits: the grid's best
    assert rule_best(_grid({bf16: [100, 101]}, {keep: 0.0})) == bf16


class Now:
    """A host as it runs the configs now, for the verdict: speeds with a little noise."""

    def __init__(self, speeds: dict[tuple[int, str, bool, str], float]) -> None:
        self.speeds, self.random, self.timed = speeds, random.Random(1), []

    def speed(self, key: tuple[int, str, bool, str]) -> float:
        self.timed.append(key)
        return self.speeds[key] * (1 + self.random.uniform(-0.01, 0.01))


def test_the_verdict_scores_a_pick_against_the_rules_best_as_the_host_runs_them_now() -> None:
    """A replay's grid was timed hours before its searches: where the host has lost its
    bf16 edge since, a search that kept fp32 on a tie is right, and the verdict (the
    picks timed again beside the grid's candidates) scores it 1 where the grid says it
    missed; where the edge holds, the miss stays a miss."""
    from families import rule_ratio, verdict

    keep, bf16, slow = (
        (8, "fp32", False, "adamw_torch"),
        (8, "bf16", False, "adafactor"),
        (4, "fp32", False, "adamw_torch"),
    )
    grid = _grid({keep: [100, 98, 101, 99], bf16: [120, 119, 121, 118]}, {slow: 50.0})
    assert rule_ratio(keep, grid) < 0.9
    picks = {"autotune": [{"found": list(keep)}, {"found": list(bf16)}, {"found": None}]}

    tied = Now({keep: 100.0, bf16: 101.0})
    said = verdict(tied, grid, picks)  # type: ignore[arg-type]
    assert [o["now_ratio"] for o in picks["autotune"]] == [1.0, 1.0, 0.0]
    assert said["rule_best"] == list(keep)  # the change is no longer significant
    assert set(tied.timed) == {keep, bf16} and len(tied.timed) >= 2 * ROUNDS

    still = Now({keep: 100.0, bf16: 120.0, slow: 60.0})
    picks["autotune"].append({"found": list(slow)})
    verdict(still, grid, picks)  # type: ignore[arg-type]
    kept, changed, none, slower = (o["now_ratio"] for o in picks["autotune"])
    assert kept == pytest.approx(100 / 120, abs=0.01) and (changed, none) == (1.0, 0.0)
    assert slower == pytest.approx(0.5, abs=0.01)  # timed now, though the grid's pass had it
