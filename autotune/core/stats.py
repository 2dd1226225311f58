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
of the paired ratios, with an interval from Student's t over the rounds, which narrows
as rounds are added where the quartiles of pooled steps do not. The duel reads it after
every round and stops once it decides, so the interval is a repeated confidence interval
(Jennison and Turnbull): each look's is Student's at Pocock's nominal level for 15 looks
(`NOMINAL`, 0.86% two-sided), so that all of up to 16 rounds' (twice the default
--confirm-rounds; more rounds, more looks, and a little more error) hold the true ratio
95% of the time together. Student's 95% widened by a constant (Pocock's 1.3 for the
normal) was too narrow at the few rounds of a duel's first looks, where t's tails are
heavy.
benchmarks/duel_errors.py runs the real duel on drawn rounds whose paired ratio swings
6% or 11% (sd of its log): a bf16 change of fp32's speed was exported after 12% of
duels with one look's 95%, 5.3-6.3% with it widened 1.3x, and 2.2-2.9% now; a 10%
gain is confirmed in 99.8% and 74% of duels (79% widened, paid for in false changes).
"""

from __future__ import annotations

import dataclasses
import functools
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
    """The figures of all runs of one config: pooled step times, the highest peak, the
    most subnormal optimizer state any run left (with what it timed the CPU at)."""
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
    subnormal = max(every, key=lambda r: r.subnormal_share or 0.0)
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
        subnormal_share=subnormal.subnormal_share,
        subnormal_slowdown=subnormal.subnormal_slowdown,
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
    rounds: int = 0  # >0: from this many paired rounds (`paired_ratio`), a repeated 95%

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


# Pocock's nominal two-sided level for each of 15 looks at an overall 5% (the paired
# rounds' interval is read after each of rounds 2 to 16: module docstring)
NOMINAL = 0.0086
# The paired rounds a decision takes at the least where rounds swing 4-11% (this
# project's 2-core hosts): at two, t at one degree of freedom is 74 at that level, and
# only rounds that agree within a fraction of a percent decide.
ROUNDS_TO_DECIDE = 3
Rounds = tuple[tuple[int, float], ...]  # (round, the run's quiet step time), a config's


def paired_ratio(faster: Rounds, slower: Rounds) -> SpeedRatio | None:
    """`faster`'s speed over `slower`'s from the rounds both ran in: the geometric mean
    of the paired ratios of their step times, with its 95% repeated confidence interval
    (module docstring). None with fewer than two such rounds (no interval)."""
    fast, slow = dict(faster), dict(slower)
    logs = [math.log(slow[r] / fast[r]) for r in sorted(fast.keys() & slow.keys()) if fast[r] > 0]
    if len(logs) < 2:
        return None
    mean = statistics.mean(logs)
    half = t_quantile(NOMINAL, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return SpeedRatio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))


@functools.cache
def t_quantile(two_sided: float, df: int) -> float:
    """Student's t beyond which a two-sided tail of `two_sided` lies, at `df` degrees of
    freedom: bisection on the t distribution's closed form for whole degrees of freedom."""
    assert 1e-6 < two_sided < 1 and df >= 1, (two_sided, df)
    low, high = 0.0, 1e6
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if _two_sided_tail(mid, df) > two_sided else (low, mid)
    return high


def _two_sided_tail(t: float, df: int) -> float:
    """P(|T| > t) for Student's T at whole `df` (Abramowitz and Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    cos2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    first = 2 if df % 2 else 1  # the series' first power of cos^2: odd df, even df
    for k in range(first, df - 1, 2):
        term *= cos2 * k / (k + 1)
        total += term
    if df % 2 == 0:
        return 1.0 - math.sin(theta) * total
    if df == 1:
        return 1.0 - 2 * theta / math.pi
    return 1.0 - 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)


def _quartiles(times: Sequence[float]) -> tuple[float, float]:
    """The lower and upper quartiles, interpolated between the steps; of two steps (a
    probe under a very short budget) their whole range, which is all two steps can say
    (interpolated, it would be half of it); of one step, itself."""
    if len(times) <= 2:
        return min(times), max(times)
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q1, q3
