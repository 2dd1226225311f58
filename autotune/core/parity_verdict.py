"""A finalist's training-parity verdict (core/parity.py judges it): its own module, so a
trial's record can hold one without the judging, which reads trials."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class Status(enum.StrEnum):
    SAME = "same-arithmetic"  # differs from the reference only in what keeps the arithmetic
    OK = "ok"  # measured: learns like the reference
    # measured within the tolerance, by a run too short to tell it from rounding noise
    UNVERIFIED = "unverified"
    DIVERGED = "diverged"  # measured: does not (NaN, collapsing scale, or off the curve)
    UNCHECKED = "unchecked"  # not measured (--parity off, or no verdict possible)


@dataclasses.dataclass(frozen=True)
class Parity:
    """A config's parity verdict, with the figures it rests on."""

    status: Status
    reason: str = ""
    final_loss: float | None = None
    reference_final_loss: float | None = None
    start_loss: float | None = None
    gap: float | None = None  # (end - reference end) / reference progress; + is worse
    tolerance: float | None = None
    steps: int = 0
    # unverified, and exported because the user allowed that (--parity quick)
    allowed: bool = False
    evidence: str = "runs"  # "probes": the probes' own training losses (judge_probes)

    @property
    def ratio(self) -> float | None:
        """The end loss over the reference's."""
        if self.final_loss is None or not self.reference_final_loss:
            return None
        return self.final_loss / self.reference_final_loss

    @property
    def blocks_export(self) -> bool:
        return self.status == Status.DIVERGED or (
            self.status == Status.UNVERIFIED and not self.allowed
        )

    def figures(self) -> str:
        """One line: the verdict and its figures."""
        if self.status == Status.SAME:
            return "same arithmetic as the reference"
        if self.final_loss is None or self.reference_final_loss is None:
            return f"{self.status}: {self.reason}"
        gap = f", {self.gap:+.1%} of its progress" if self.gap is not None else ""
        tol = f" (tolerance {self.tolerance:.1%})" if self.tolerance is not None else ""
        steps = f"{self.steps} probe steps" if self.evidence == "probes" else f"{self.steps} steps"
        # the start gives the gap its scale: 29.9 against 11.3 is 12% of a fall from 160
        start = f" (from {_num(self.start_loss)})" if self.start_loss is not None else ""
        return (
            f"{self.status}: loss {_num(self.final_loss)} vs reference "
            f"{_num(self.reference_final_loss)}{start} after {steps}{gap}{tol}"
            + (f"; {self.reason}" if self.reason else "")
            + (
                "; exported unverified (--parity on exports verified configs only)"
                if self.allowed
                else ""
            )
        )

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Parity:
        return cls(**{**raw, "status": Status(raw["status"])})


def _num(value: float) -> str:
    return f"{value:.4g}"
