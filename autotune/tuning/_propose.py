"""Structure-aware proposals (issue #15, `--sampler model`): batch, precision,
checkpointing, optimizer, sampling and the levers act on step time in largely separable
ways, so a model of that, fitted to the probes so far, predicts the configs not yet
tried. The search probes the most promising next, and stops once no untried config has
a fair chance of beating the best so far by more than the noise, and says so.

The model: Bayesian linear regression of log cost on one effect per value of each
dimension the space varies (a broad prior: a value may halve or double the cost; the
batch's, checkpointing's and the optimizer's narrower) and one per pair of values (a
narrow prior: interactions are small unless the data shows them). The cost is
what selection ranks by: the step time, the time to finish the user's run, or with
`--objective efficiency` the step time x peak. The noise is the residual of a
main-effects fit once there are a few spare probes (at least NOISE), NOISE_SD before.

The effects are fitted about what step time is known to do (`expected`): a larger
micro-batch spreads a step's fixed costs over more samples, checkpointing recomputes the
forward. Without it every untried value was as promising as any other, and a search of a
few probes spent them on slow corners: the LoRA job of the families with memory binding
(7 probes) tried checkpointing at batches 8, 4 and 2 and never 4x4 bf16 without it, the
best (0.905 of it in the real replay; simulated, 0.851 in 20 of 20 searches, and with the
prior, the last probe's rule below and the memory verdict's OOM_NEAR, 0.978 in 30, the
7 under 0.95 at batch 4 without checkpointing, another optimizer or precision).

A proposal is the open config with the lowest optimistic bound (predicted log cost less
KAPPA standard deviations), so untried values and pairs are tried while they may still
win; configs the memory estimate says will not fit come last. The search stops when
even that bound is within NOISE of the incumbent. The last probe the limits allow goes
to the greatest expected gain over the best so far instead: what exploring would teach,
no later probe could use. Replays on known spaces (tests) find
the best of 240 configs within 3% in about 31 probes, interactions included.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Callable, Sequence

import numpy as np

from autotune.core.enums import Objective
from autotune.core.schedule import CLEARLY_SLOWER
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialRecord
from autotune.tuning.selection import fitting, incumbent_cost, record_cost

NOISE = 0.03  # a predicted gain below 3% is within what measurement noise hides
KAPPA = 1.5  # how many standard deviations of optimism a proposal gets
MAIN_SD = 0.5  # prior sd of a value's effect on log cost (a factor of 1.6 either way)
PAIR_SD = 0.15  # prior sd of an interaction of two values (15%)
NOISE_SD = 0.05  # sd of a probe's log cost before the residual says otherwise
MIN_DOF = 3  # probes beyond the main effects before the residual is trusted
SLOWEST = 2.0  # a clearly slower probe's cost, at most this x the best so far (_bounded)
STANDARD = statistics.NormalDist()  # expected_gain's
# What step time is expected to do before any probe says (`expected`), fitted to the
# families' grids (benchmarks/families.json, 8 settings of 60 configs on a 2-core CPU):
OVERHEAD = 1.0  # a micro-batch's fixed cost in one sample's compute: a doubled batch took
# 0.21, 0.23, 0.11, 0.05 less log time from 1, 2, 4, 8 (medians of 322 pairs); 1 + 1/b says
# 0.29, 0.18, 0.11, 0.06
RECOMPUTE = 0.4  # log time every layer's checkpointing adds: the forward again, a third of
# the work on a GPU (0.29); 0.46 on the CPU grids (median of 162 pairs, sd 0.14, 0.02-0.77)
BATCH_SD = 0.3  # prior sd of a batch's effect about the fixed cost's curve (the grids' pairs:
# 0.12-0.2 per doubling, noise included; a GPU's launches may make small batches dearer)
RECOMPUTE_SD = 0.15  # prior sd of each checkpointing level's effect about that
OPTIM_SD = 0.2  # prior sd of an optimizer's effect: its step is a small share of a step
# (the grids: sd 0.11 between optimizers, measurement noise included; 8-bit or paged ones
# on a GPU may cost a few tens of percent)


def dimensions(candidate: Candidate) -> tuple[tuple[str, object], ...]:
    """The candidate's value in each dimension the model has an effect for."""
    values = [
        ("batch", candidate.per_device_train_batch_size),
        ("precision", str(candidate.precision)),
        ("checkpointing", candidate.activation_checkpointing),
        ("optim", candidate.optim),
        ("sampling", candidate.train_sampling_strategy),
    ]
    return tuple(values + sorted(candidate.lever_values().items()))


@functools.lru_cache(maxsize=65536)
def features(
    candidate: Candidate, varying: frozenset[str] | None = None
) -> tuple[tuple[object, ...], ...]:
    """Each value of the candidate, and each pair of its values (the interactions); with
    `varying`, only those of the dimensions named (a dimension of one value is the
    intercept's, and its pairs each another copy of a value's effect)."""
    values = tuple(v for v in dimensions(candidate) if varying is None or v[0] in varying)
    pairs = [(a, b) for i, a in enumerate(values) for b in values[i + 1 :]]
    return (*values, *pairs)


@dataclasses.dataclass(frozen=True)
class Proposal:
    """The next config to probe, or (candidate None) why the search may stop."""

    candidate: Candidate | None
    predicted_s: float | None = None
    why_stop: str = ""


class CostModel:
    """Bayesian linear regression of log cost on the values and pairs of values of the
    dimensions the space varies: main effects about what `expected` says (`prior`; else
    about nothing) with broader priors, interactions with a narrow one (they exist where
    the data shows them), so a few probes fit the main effects and more reveal the pairs."""

    def __init__(
        self,
        points: Sequence[tuple[Candidate, float]],
        space: Sequence[Candidate],
        *,
        prior: bool = True,
    ) -> None:
        every = [*space, *(c for c, _ in points)]
        seen: dict[str, set[object]] = {}
        for candidate in every:
            for name, value in dimensions(candidate):
                seen.setdefault(name, set()).add(value)
        # Each of 9 levers at one value paired with a value made 9 more copies of its
        # effect (sd 0.15 each): a config one optimizer from a measured one was as
        # uncertain (sd 0.54) as one of untried values, and the proposals explored on.
        self.varying = frozenset(name for name, values in seen.items() if len(values) > 1)
        index: dict[tuple[object, ...], int] = {}
        for candidate in every:
            for feature in features(candidate, self.varying):
                index.setdefault(feature, len(index))
        self.index = index
        self.n = len(points)
        self.expected = expected if prior else (lambda candidate: 0.0)
        y = np.array([math.log(cost) - self.expected(c) for c, cost in points])
        self.mean = float(y.mean()) if self.n else 0.0
        x = np.array([self._row(c) for c, _ in points]).reshape(self.n, len(index))
        prior_sd = np.array([_prior_sd(f, prior) for f in index])
        self.noise = self._noise(points, y)
        precision = x.T @ x / self.noise**2 + np.diag(1.0 / prior_sd**2)
        self.cov = np.linalg.inv(precision)
        self.effects = self.cov @ x.T @ (y - self.mean) / self.noise**2

    def _row(self, candidate: Candidate) -> np.ndarray:
        row = np.zeros(len(self.index))
        for feature in features(candidate, self.varying):
            row[self.index[feature]] = 1.0
        return row

    def _noise(self, points: Sequence[tuple[Candidate, float]], y: np.ndarray) -> float:
        """The residual sd of a main-effects fit, once there are MIN_DOF spare probes."""
        values = sorted({v for c, _ in points for v in dimensions(c)}, key=repr)
        if self.n - (1 + len(values) - len({name for name, _ in values})) < MIN_DOF:
            return NOISE_SD
        column = {v: i for i, v in enumerate(values)}
        x = np.zeros((self.n, len(values)))
        for row, (candidate, _) in enumerate(points):
            for value in dimensions(candidate):
                x[row, column[value]] = 1.0
        beta, *_ = np.linalg.lstsq(x, y - self.mean, rcond=None)
        free = 1 + len(values) - len({name for name, _ in values})
        residual = float(np.sum((y - self.mean - x @ beta) ** 2)) / (self.n - free)
        return max(NOISE, math.sqrt(residual))

    def predict(self, candidate: Candidate) -> tuple[float, float]:
        """(log cost, its standard deviation)."""
        row = self._row(candidate)
        log_cost = self.mean + self.expected(candidate) + float(row @ self.effects)
        return log_cost, math.sqrt(float(row @ self.cov @ row))


def expected(candidate: Candidate) -> float:
    """The log step time a config is expected to take before any probe, up to a constant:
    a micro-batch's fixed cost (the launches, the Python, a read of every weight) spread
    over its samples, 1 + OVERHEAD/b at a fixed global batch; and the forward's recompute
    of the layers checkpointing covers (every one, or every nth)."""
    recompute = RECOMPUTE * candidate.activation_checkpointing.recomputed
    return math.log1p(OVERHEAD / candidate.per_device_train_batch_size) + recompute


def _prior_sd(feature: tuple[object, ...], prior: bool) -> float:
    """A value's effect may move its cost by about MAIN_SD, a pair's by PAIR_SD; with the
    prior, a checkpointing level's by RECOMPUTE_SD about what `expected` says of it, an
    optimizer's by OPTIM_SD."""
    if len(feature) != 2 or not isinstance(feature[0], str):
        return PAIR_SD
    if not prior:
        return MAIN_SD
    sds = {"batch": BATCH_SD, "checkpointing": RECOMPUTE_SD, "optim": OPTIM_SD}
    return sds.get(feature[0], MAIN_SD)


def propose(
    records: Sequence[TrialRecord],
    open_configs: Sequence[Candidate],
    cost: Callable[[TrialRecord], float | None],
    *,
    fits: Callable[[Candidate], bool] = lambda c: True,
    incumbent_s: float | None = None,
    prior: bool = True,
    last: bool = False,
) -> Proposal:
    """The open config with the most promising optimistic bound (its predicted log cost
    less KAPPA sd), or a Proposal saying why none is worth a probe. The last probe the
    limits allow (`last`) goes to the greatest expected gain over the best so far
    instead: no later probe can use what exploring would teach.

    `records`: the probes so far (those with a cost are the model's data); `cost` reads a
    record's cost; `fits`: the memory estimate's verdict (configs it says will not fit
    come last); `incumbent_s`: the best cost among configs that fit; `prior`: the cost is
    a step time, which `expected` knows something of (not a step time x peak)."""
    if not open_configs:
        return Proposal(None, why_stop="every config is measured or ruled out")
    points = [
        (r.candidate, _bounded(r, c, incumbent_s))
        for r in records
        if (c := cost(r)) is not None and c > 0
    ]
    model = CostModel(points, open_configs, prior=prior)
    scored = []
    for candidate in open_configs:
        log_cost, sd = model.predict(candidate)
        rank = log_cost - KAPPA * sd  # lower first
        if last and incumbent_s is not None and points:
            rank = -expected_gain(log_cost, sd, math.log(incumbent_s))
        scored.append((not fits(candidate), rank, log_cost, candidate, log_cost - KAPPA * sd))
    scored.sort(key=lambda s: (s[0], s[1]))
    _, _, best_log, best, _ = scored[0]
    if incumbent_s is not None and points:
        likely = [s for s in scored if not s[0]] or scored  # those the estimate says fit
        bar = math.log(incumbent_s) + math.log(1.0 - NOISE)
        if min(s[4] for s in likely) >= bar:
            return Proposal(
                None,
                predicted_s=math.exp(best_log),
                why_stop=(
                    f"the model of step time ({len(points)} probes, noise "
                    f"{100 * model.noise:.0f}%) gives no untried config a chance of beating "
                    f"the best so far by more than {100 * NOISE:.0f}%"
                ),
            )
    return Proposal(best, predicted_s=math.exp(best_log))


def expected_gain(log_cost: float, sd: float, incumbent_log: float) -> float:
    """The expected improvement in log cost over the incumbent of a config whose log cost
    is normal (`log_cost`, `sd`): what probing it buys when nothing can follow."""
    if sd <= 0.0:
        return max(0.0, incumbent_log - log_cost)
    z = (incumbent_log - log_cost) / sd
    return sd * (z * STANDARD.cdf(z) + STANDARD.pdf(z))


def _bounded(record: TrialRecord, cost: float, incumbent_s: float | None) -> float:
    """A probe stopped as clearly slower after a step or two enters the model at no more
    than SLOWEST x the best so far: its steps say it is slower, not by how much. One
    step caught by another process on the host took 35x its time (3.6 s against about
    0.1; a 2-core VM with one core busy) and, taken as the config's cost, ruled out its
    precision for the rest of the search."""
    if incumbent_s is None or record.result.measure_stop != CLEARLY_SLOWER:
        return cost
    return min(cost, SLOWEST * incumbent_s)


def next_config(
    spec: SearchSpec,
    records: Sequence[TrialRecord],
    open_configs: Sequence[Candidate],
    *,
    fits: Callable[[Candidate], bool],
    concurrent: int,
    objective: Objective,
    last: bool = False,
) -> Proposal:
    """The search's next proposal: the cost selection ranks by, the memory estimate's
    verdict (`fits`: the round's, tuning.memory_verdict), and the incumbent among configs
    measured alike; `last`: the limits allow no probe after it (`stopping.last_probe`).
    Ranking by speed where memory binds nowhere, activation checkpointing is left out
    (`memory_free`)."""
    incumbent = incumbent_cost(
        records,
        fit_limit_bytes=spec.fit_limit_bytes,
        train_steps=spec.train_steps,
        concurrent=concurrent,
        objective=objective,
    )
    # Per GiB (--objective efficiency), checkpointing's saving may win.
    if objective != Objective.EFFICIENCY and memory_free(spec, records, fits):
        kept = [c for c in open_configs if not c.activation_checkpointing]
        if open_configs and not kept:
            return Proposal(
                None,
                why_stop=(
                    "every config fits without activation checkpointing, and what is left "
                    "only adds it (checkpointing trades time for memory)"
                ),
            )
        open_configs = kept
    return propose(
        records,
        open_configs,
        lambda r: record_cost(r, spec.train_steps, objective),
        fits=fits,
        incumbent_s=incumbent,
        prior=objective != Objective.EFFICIENCY,  # checkpointing's saving may win per GiB
        last=last,
    )


def memory_free(
    spec: SearchSpec, records: Sequence[TrialRecord], fits: Callable[[Candidate], bool]
) -> bool:
    """Whether memory binds nowhere in the space: every config without activation
    checkpointing fits, measured within the limit or, not yet measured, by the estimate.

    Checkpointing recomputes the forward pass to hold fewer activations: it trades time
    for memory and never makes a config faster than its twin without it (the families'
    grids: 156 pairs, 0.64x the twin's speed at the median, 1.005x at most). Where
    nothing needs the memory, its probes are spent for nothing: with them left out, the
    families' replays with memory free scored 0.97-1.0 in every search (seq2seq 0.939
    and encoder 0.966 on average before). Where memory binds anywhere, they stay: leaving out
    only the configs whose own twin fits kept checkpointing to the largest batches, where
    the model could not tell its cost from the batch's, and the causal LM's replays then
    missed the best (4x4 bf16, which fits) for 2x8 (0.836)."""
    if not any(spec.space.checkpointing) or all(spec.space.checkpointing):
        return False
    measured: dict[Candidate, bool] = {}
    for record in records:
        measured[record.candidate] = measured.get(record.candidate, False) or bool(
            fitting([record], spec.fit_limit_bytes)
        )
    return all(
        measured[c] if c in measured else fits(c)
        for c in spec.space.candidates(include_fallback=False)
        if not c.activation_checkpointing
    )
