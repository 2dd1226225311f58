"""When a probe's warm-up ends and its measurement stops (issue #15, adaptive measurement).

Pure rules on a run's step times so far, used live by the probe's timer and replayed on
recorded series by the tests:

- Warm-up ends when step time is steady: the first two steps in a row within STEADY of
  each other are the first two measured, or two a step apart where the step between
  them is the host's (at most `max_warmup` steps of warm-up; an fp16 loss scale still
  calibrating is never steady). On a 2-core host whose steps drift 10% from one to the
  next, waiting for two in a row cost a NeoX probe of 5 s steps one or two more steps
  of warm-up, a third of the probe.
- Measurement stops once at least `min_measure` steps are in (3: the window the memory
  headroom and the NaN check were sized on stays near what it was) and the band of the
  measured steps is tight enough to rank the candidate against the incumbent (the best
  config so far): clearly faster, clearly slower, or a tie; and at once, from the first
  measured step, when even the fastest step is clearly slower than the incumbent (only
  contenders pay for the whole window, in the spirit of successive halving). Without an
  incumbent it stops when the band is tight. `max_measure` steps end it in any case.
- Fast steps are measured for a time: but for the clearly slower, no window closes
  before its steps last `min_window_s` (or `most` steps are in). Three 80 ms steps are a
  quarter of a second, where one slow step (the host's other work) moves the median by
  half; a second of them ranks on a dozen.
- A stalled window is not closed: while its median is over STALLED x its fastest step
  (most of its steps caught by the host's other work: 4154, 504 and 141 ms, where the
  config takes 141), more steps come, up to `most`. A first probe has no incumbent to
  be stopped against, and its median, taken as the config's, had a search export a
  config at 0.57 of the best.

Costs compare in seconds: with the user's run length (`train_steps`), the time to finish
it (the one-time cost + steps x step time, as selection ranks); else the step time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

STEADY = 0.10  # a step within 10% of the one before it: warm-up is over
SLOWER = 0.25  # even the fastest step 25% over the incumbent: clearly slower
TIGHT = 0.05  # the measured steps' range within 5% of their median: a tight band
STALLED = 1.5  # a window's median over 1.5x its fastest step: most steps were stalled
CLEARLY_SLOWER = "clearly slower than the best so far"  # the stop that needs no band


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The limits of one probe's steps, and the incumbent it is measured against."""

    max_warmup: int
    max_measure: int
    min_measure: int = 3
    incumbent_s: float | None = None  # the incumbent's cost (see the module docstring)
    train_steps: int = 0  # the user's run length: costs are times to finish it
    min_window_s: float = 0.0  # no window shorter than this (but for the clearly slower)
    most: int = 0  # ... unless this many steps are in (0: max_measure)

    @property
    def longest(self) -> int:
        """The most measured steps a probe may take."""
        return max(self.max_measure, self.most)

    def warmup_steps(
        self, durations: Sequence[float], *, calibration_steps: int = 0, calibrating: bool = False
    ) -> int | None:
        """How many steps are warm-up, once that is known (else None).

        `durations[j]` is step j+2's time (the first step has no mark before it). The
        first two steps in a row within STEADY of each other are the first two measured
        (or two a step apart: the one between them is measured too, as the host's);
        an fp16 loss scale's initial run of skipped steps (`calibration_steps`, or
        `calibrating` while it lasts) is never taken as steady."""
        if calibrating:
            return None
        # the loss scale's skipped steps are never timed, whatever the limit
        limit = max(1, self.max_warmup, calibration_steps)
        first = max(1, calibration_steps)
        for j in range(first, min(len(durations), limit + 1)):
            if _close(durations[j], durations[j - 1]):
                return j
            # one step the host caught between two that agree: steady from the first
            if j > first and _close(durations[j], durations[j - 2]):
                return j - 1
        # `limit` steps of warm-up once the step after them is in (it may still show
        # that step `limit` was already steady)
        return limit if len(durations) >= limit else None

    def stop_reason(self, measured: Sequence[float], one_time_s: float = 0.0) -> str:
        """Why measurement stops after these measured step times ('' to go on)."""
        n = len(measured)
        if n == 0:
            return ""
        short = sum(measured) < self.min_window_s and n < self.longest  # fast steps: more
        # Most steps caught by the host's other work: more, until the median is a step's.
        stalled = _median(measured) > STALLED * min(measured) and n < self.longest
        if n >= self.max_measure and not short and not stalled:
            return "full window"
        if self.incumbent_s is not None:
            if self._cost(min(measured), one_time_s) > self.incumbent_s * (1.0 + SLOWER):
                return CLEARLY_SLOWER
        if n < self.min_measure or short:
            return ""
        lo, hi = min(measured), max(measured)
        if (hi - lo) > TIGHT * _median(measured):
            return ""  # noisy: more steps
        if self.incumbent_s is None:
            return "steady"
        if self._cost(lo, one_time_s) > self.incumbent_s:
            return "slower than the best so far"
        if self._cost(hi, one_time_s) < self.incumbent_s:
            return "faster than the best so far"
        return "level with the best so far"

    def _cost(self, step_s: float, one_time_s: float) -> float:
        return one_time_s + self.train_steps * step_s if self.train_steps else step_s


def _close(step: float, before: float) -> bool:
    return before > 0 and abs(step - before) <= STEADY * before


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
