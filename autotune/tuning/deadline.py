"""The time budget, in one place: when exploring stops and when confirmation must."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True)
class Deadline:
    """A point in time (on `clock`), or none. `clock` is injectable, so time-dependent
    rules are tested without sleeping."""

    at: float | None
    clock: Clock = time.monotonic

    @classmethod
    def after(cls, seconds: float | None, clock: Clock = time.monotonic) -> Deadline:
        return cls(None if seconds is None else clock() + seconds, clock)

    def left(self) -> float | None:
        """Seconds left (0 once passed), or None without a budget."""
        return None if self.at is None else max(0.0, self.at - self.clock())

    def passed(self) -> bool:
        return self.at is not None and self.clock() >= self.at

    def over(self) -> float:
        """Seconds past it (0 before it, or without a budget)."""
        return 0.0 if self.at is None else max(0.0, self.clock() - self.at)

    def less(self, seconds: float) -> Deadline:
        """`seconds` earlier: what the steps before a reserved one may use."""
        return self if self.at is None else Deadline(self.at - seconds, self.clock)

    def share(self, fraction: float) -> Deadline:
        """A deadline `fraction` of the way from now to this one (exploration stops at 80%
        of the budget to leave the rest for confirming the finalists)."""
        left = self.left()
        return self if left is None else Deadline(self.clock() + fraction * left, self.clock)
