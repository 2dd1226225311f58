"""The user's dataset as a search records it: lengths, truncation, padding waste.

Computed once per search by `autotune.hf.corpus`; a plain value here so the spec, the
reports and the store read it without loading any data library.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class LengthStats:
    """Token lengths of a column before truncation."""

    count: int
    max: int
    mean: float
    p50: int
    p90: int
    p99: int

    @classmethod
    def of(cls, lengths: Sequence[int]) -> LengthStats:
        ordered = sorted(lengths)

        def pct(q: float) -> int:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

        return cls(
            len(ordered),
            ordered[-1],
            round(statistics.fmean(ordered), 1),
            pct(0.5),
            pct(0.9),
            pct(0.99),
        )

    def describe(self) -> str:
        return (
            f"{self.count} samples, tokens: max {self.max}, p99 {self.p99}, p90 {self.p90}, "
            f"median {self.p50}, mean {self.mean}"
        )


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """The user's dataset as a search uses it."""

    source: str  # what --dataset named
    path: str  # the tokenized data (datasets.save_to_disk), read by each probe
    tokenizer: str  # what tokenized it ("" when the data came tokenized)
    text_column: str
    target_column: str
    lengths: LengthStats  # of the input, before truncation
    target_lengths: LengthStats | None  # seq2seq targets
    truncated: float  # share of samples longer than the probe's length (cut to it)
    # Padding waste per micro-batch and sampling, over the whole dataset: pad tokens /
    # all tokens fed to the model when every micro-batch is padded to its longest.
    padding_waste: dict[str, dict[str, float]]
    fingerprint: str  # of the tokenized ids: a study is tied to its data
    pad_token_id: int

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DataSpec:
        target = raw.get("target_lengths")
        return cls(
            **{
                **raw,
                "lengths": LengthStats(**raw["lengths"]),
                "target_lengths": LengthStats(**target) if target else None,
            }
        )

    def summary(self) -> dict[str, Any]:
        """Length distribution, truncation and padding waste (for show and the sidecar)."""
        raw = dataclasses.asdict(self)
        del raw["path"]  # where this machine keeps its tokenized copy
        return raw

    def describe(self) -> str:
        cut = f"; {100 * self.truncated:.1f}% truncated" if self.truncated else ""
        return f"data {self.source}: {self.lengths.describe()}{cut}"
