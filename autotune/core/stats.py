"""Step-time statistics, in one place: a run's median and spread, and the pooling of a
config's runs (confirm before crowning).

A confirmation is a separate run of the same config with more measured steps.
Selection uses the pooled step times of every run of a config, so one lucky run cannot
win, and a config that fails a confirmation (OOM, NaN) is out. Figures measured while
other probes shared the cores (`--parallel` on the CPU) are not comparable with figures
measured alone: once a config has a run measured alone, only its runs measured alone
are pooled.

Configs are ranked by their quiet step time, not the median: the lower quartile of
their measured steps. Another process's work on the host only ever slows a step, and on
a 2-core machine like this project's a slow spell took 6 of a probe's 10 steps (t5 at 8x2
bf16: 86-93 ms, then 103-139 ms), so its median (115 ms) ranked the config a quarter
slower than its quiet steps (90 ms) and the search exported fp32 at 0.73 of the best.
Over six interleaved rounds of five configs there, the lower quartile moved half as much
from round to round as the median (0.025 against 0.047 in log step time), and as little
as it where the host was calm. The figures kept and exported stay the median and the
spread (invariant 6). With real batches of varying length (`--dataset`) a step's time
also depends on its batch, so the median ranks there.

Two configs measured in the same rounds (confirmation runs made back to back, the order
alternating from round to round) compare round by round: the ratio is the geometric mean
of the paired ratios, with a 95% interval (Student's t over the rounds), which narrows as
rounds are added where the quartiles of pooled steps do not. The duel reads it after
every round and stops once it decides: a 95% interval read after each of up to 16 rounds
holds 1 less often than 95% of the time, so it is widened by `LOOKS` (Pocock's constant
boundary for repeated looks is 1.23-1.33 times one look's quantile, for 5 to 15 looks).
benchmarks/duel_errors.py runs the real duel on drawn rounds whose paired ratio swings
6% or 11% (sd of its log): a bf16 change of fp32's speed was exported after 8.6% of
duels, unwidened and at most 8 rounds, and after 5.3-6.3% now; a 10% gain was
confirmed in 98% and 66% of duels then, 100% and 79% now.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from autotune.core.enums import Outcome
from autotune.core.trial import TrialResult


@dataclasses.dataclass(frozen=True)
class StepStats:
    """The median of step times, their spread (interquartile range / median) and the
    quiet step time: the lower quartile, interpolated between the measured steps (so 3
    steps and 4 rank alike, and one fast step among 5 moves it no more than the median)."""

    median_s: float
    spread: float
    count: int
    quiet_s: float

    @classmethod
    def of(cls, times: Sequence[float]) -> StepStats:
        """Raises ValueError on an empty series; one step has no spread (0)."""
        if not times:
            raise ValueError("no step times")
        median = statistics.median(times)
        if len(times) < 2 or median <= 0:
            return cls(median, 0.0, len(times), median)
        q1, _, q3 = statistics.quantiles(times, n=4)
        quiet = statistics.quantiles(times, n=4, method="inclusive")[0]
        return cls(median, (q3 - q1) / median, len(times), quiet)


def quiet_step_s(result: TrialResult) -> float | None:
    """The step time a config is ranked by: as measured (`step_time_quiet_s`), else
    derived from the run's steps (an older study's result), the median with real batches."""
    if result.step_time_quiet_s is not None:
        return result.step_time_quiet_s
    median = result.step_time_median_s
    if median is None or result.worst_case_samples_per_s is not None or not result.step_times_s:
        return median
    return StepStats.of(result.step_times_s).quiet_s


def pooled(original: TrialResult, confirmations: Sequence[TrialResult]) -> list[TrialResult]:
    """The runs whose step times are comparable: all, or only those measured alone."""
    runs = [original, *confirmations]
    alone = [r for r in runs if r.concurrent == 1]
    return alone if alone and len(alone) < len(runs) else runs


def combine(original: TrialResult, confirmations: Sequence[TrialResult]) -> TrialResult:
    """The figures of all runs of one config: pooled step times, the highest peak."""
    if not confirmations or original.outcome != Outcome.OK:
        return original
    for run in confirmations:
        if run.outcome != Outcome.OK:
            return run.replace(reason=f"confirmation run: {run.reason or run.outcome.value}")
    every = [original, *confirmations]
    probe_losses = original.step_losses  # the probe's batches, the ones every probe trains on
    runs = pooled(original, confirmations)
    original = runs[0]
    times = [t for run in runs for t in run.step_times_s]
    if not times:
        return original
    stats = StepStats.of(times)
    samples_per_step = (original.samples_per_s or 0.0) * (original.step_time_median_s or 0.0)
    tokens_per_sample = (original.tokens_per_s or 0.0) / (original.samples_per_s or 1.0)
    samples_per_s = samples_per_step / stats.median_s
    flops_per_sample = (original.model_flops_per_s or 0.0) / (original.samples_per_s or 1.0)
    peaks = [r.peak_memory_bytes for r in every if r.peak_memory_bytes is not None]
    # Each run's quiet time, then their mean: a slow spell inside a run is left out, but
    # a run that was quick throughout cannot outvote a confirmation measured slower.
    quiets = [q for run in runs if (q := quiet_step_s(run)) is not None]
    return dataclasses.replace(
        original,
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * tokens_per_sample,
        step_time_median_s=stats.median_s,
        step_time_spread=stats.spread,
        step_time_quiet_s=statistics.fmean(quiets) if quiets else None,
        step_times_s=tuple(times),
        peak_memory_bytes=max(peaks) if peaks else None,
        final_loss=confirmations[-1].final_loss,
        step_losses=probe_losses,
        model_flops_per_s=flops_per_sample * samples_per_s if flops_per_sample else None,
        pooled_runs=sum(run.pooled_runs for run in runs),
    )


@dataclasses.dataclass(frozen=True)
class SpeedRatio:
    """How many times faster one config trains than another: the ratio of their median
    step times (the global batch is the same, so of their samples/s), with the range
    their step times allow: from the slower config's lower quartile over the faster's
    upper, to its upper over the faster's lower. A range that holds 1 is a tie."""

    value: float
    low: float
    high: float
    rounds: int = 0  # >0: from this many paired rounds (`paired_ratio`), a 95% interval

    @property
    def tie(self) -> bool:
        return self.low <= 1.0 <= self.high

    def describe(self) -> str:
        over = f"{self.rounds} paired rounds" if self.rounds else "their step times"
        spread = f"{self.low:.2f}-{self.high:.2f}x over {over}"
        if self.tie:
            return f"{self.value:.2f}x, a tie within the noise ({spread})"
        return f"{self.value:.2f}x ({spread})"


def speed_ratio(faster: TrialResult, slower: TrialResult) -> SpeedRatio | None:
    """`faster`'s speed over `slower`'s; None where either has no measured steps."""
    if not faster.step_times_s or not slower.step_times_s:
        return None
    fast_low, fast_high = _quartiles(faster.step_times_s)
    slow_low, slow_high = _quartiles(slower.step_times_s)
    value = statistics.median(slower.step_times_s) / statistics.median(faster.step_times_s)
    return SpeedRatio(value, slow_low / fast_high, slow_high / fast_low)


# Student's t at 97.5% (a two-sided 95% interval) by degrees of freedom, 1 to 9; past
# that the 9's (a slightly wider interval)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262)
LOOKS = 1.3  # the paired rounds' interval, read after every round (module docstring)
Rounds = tuple[tuple[int, float], ...]  # (round, the run's quiet step time), a config's


def paired_ratio(faster: Rounds, slower: Rounds) -> SpeedRatio | None:
    """`faster`'s speed over `slower`'s from the rounds both ran in: the geometric mean
    of the paired ratios of their step times, with its 95% interval. None with fewer
    than two such rounds (no interval)."""
    fast, slow = dict(faster), dict(slower)
    logs = [math.log(slow[r] / fast[r]) for r in sorted(fast.keys() & slow.keys()) if fast[r] > 0]
    if len(logs) < 2:
        return None
    mean = statistics.mean(logs)
    t = LOOKS * T975[min(len(logs) - 2, len(T975) - 1)]
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return SpeedRatio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))


def _quartiles(times: Sequence[float]) -> tuple[float, float]:
    """The lower and upper quartiles, interpolated between the steps; of two steps (a
    probe under a very short budget) their whole range, which is all two steps can say
    (interpolated, it would be half of it); of one step, itself."""
    if len(times) <= 2:
        return min(times), max(times)
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q1, q3
