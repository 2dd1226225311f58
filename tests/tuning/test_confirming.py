"""The duel (tuning/confirming.py): how many paired rounds the export's decision gets."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from helpers import SPACE, SPEC, cand, rec

from autotune.core.trial import TrialRecord
from autotune.tuning import confirming
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits

BF16 = SPACE.candidate(8, "bf16", False, "adamw_torch")
# a round's paired ratio of bf16's step time over fp32's swings +-6% around its truth
SWING = (0.94, 1.06, 0.97, 1.03, 0.95, 1.05, 0.98, 1.02)


class Store:
    """The records the duel reads and the rounds it adds, in memory."""

    def __init__(self, records: list[TrialRecord]) -> None:
        self.by_number = {r.number: r for r in records}
        self.rounds = itertools.count(1)

    def records(self) -> list[TrialRecord]:
        return list(self.by_number.values())

    def next_round(self) -> int:
        return next(self.rounds)


@dataclasses.dataclass
class Run:
    store: Store
    spec: object = dataclasses.field(
        default_factory=lambda: dataclasses.replace(SPEC, recipe_settings={"optim": "adamw_torch"})
    )
    limits: SearchLimits = dataclasses.field(
        default_factory=lambda: SearchLimits(confirm_top=1, confirm_rounds=8)
    )
    said: list[str] = dataclasses.field(default_factory=list)

    @property
    def observer(self) -> Run:
        return self

    def on_plan(self, line: str) -> None:
        self.said.append(line)


def duel(bf16_gain: float, monkeypatch: pytest.MonkeyPatch) -> int:
    """The rounds a duel runs between the fp32 recipe (1 s a step) and a bf16 change
    `bf16_gain` times as fast, each round's ratio swinging by SWING."""
    store = Store([rec(0, cand(8), sps=10.0), rec(1, BF16, sps=10.0 * bf16_gain * 1.3)])
    swings = itertools.cycle(SWING)

    def confirm_run(run: Run, record: TrialRecord, number: int, runs: int) -> None:
        if record.number == 0:
            step_s = 1.0
        else:
            step_s = next(swings) / bf16_gain
        old = store.by_number[record.number]
        store.by_number[record.number] = dataclasses.replace(
            old, rounds=(*old.rounds, (number, step_s))
        )

    monkeypatch.setattr(confirming, "confirm_run", confirm_run)
    runs = confirming.duel(Run(store), Deadline(None))  # type: ignore[arg-type]
    return runs // 2


def test_a_gain_the_rounds_read_but_cannot_yet_confirm_gets_more_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a host whose rounds swing 6%, a 3.5% gain of bf16 is not significant in the
    8 rounds --confirm-rounds allows: the rounds read it ahead, so the duel goes on, up
    to twice as many, until the gain is confirmed. A tie's rounds read no gain: it
    stops at 8, where more rounds could find none worth a change of the arithmetic."""
    assert math.prod(SWING) == pytest.approx(1.0, abs=0.01)
    assert 8 < duel(1.035, monkeypatch) <= 16
    assert duel(1.0, monkeypatch) == 8
    assert duel(1.3, monkeypatch) < 8  # clear at once
