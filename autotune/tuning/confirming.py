"""Confirming: the finalists measured again, longer (`confirm`), then paired rounds
between the two the export hinges on while they cannot be told apart (`duel`). Each
run is one process alone, stored with its round; both return the runs they made.
"""

from __future__ import annotations

import os
import time

from autotune.core.trial import TrialRecord
from autotune.tuning._context import RunContext
from autotune.tuning.deadline import Deadline
from autotune.tuning.parity import baseline
from autotune.tuning.selection import (
    by_objective,
    compare,
    decided,
    duel_pair,
    exportable,
    fitting,
    reads_ahead,
    select_for,
    verdict,
)
from autotune.tuning.stopping import confirm_s, kept_for_rounds


def confirm(run: RunContext, deadline: Deadline) -> int:
    """Measure the top finalists again, longer, until each has two runs, and then the
    plain default (where measured and it fits), so the ratio to it rests on runs
    measured alike; these runs are one round. Then, where the two finalists the export
    hinges on are close, paired rounds between them (`duel`)."""
    spec, limits = run.spec, run.limits
    runs = 0
    first_round = run.store.next_round()
    # the paired rounds a change of the recipe's arithmetic needs are a check: these
    # runs leave them their time (DESIGN invariant 14)
    kept = kept_for_rounds(spec, limits, run.store.records(), deadline.left())
    before_rounds = deadline.less(kept)
    for _ in range(2 * limits.confirm_top + 1 if limits.confirm_top else 0):
        if before_rounds.passed():
            break
        pool = [r for r in fitting(run.store.records(), spec.fit_limit_bytes) if exportable(r)]
        # The config selection would export first, then its rivals by the objective (a
        # config the objective ranks low cannot change the export)
        chosen = select_for(spec, pool, limits.objective)
        rivals = by_objective(pool, limits.objective, spec.train_steps)
        finalists = [r for r in pool if r == chosen] + [r for r in rivals if r != chosen]
        left = before_rounds.left()  # a run expected to end past it does not start
        # and then what the headline ratio is taken against (their recipe, or the plain
        # default)
        default, _ = baseline(spec, pool, None)
        wanted = finalists[: limits.confirm_top]
        if default is not None and default.number not in {r.number for r in wanted}:
            wanted.append(default)
        todo = [
            r for r in wanted if r.runs < 2 and (left is None or confirm_s(spec, limits, r) <= left)
        ]
        if not todo:
            break
        confirm_run(run, todo[0], first_round, runs)
        runs += 1
    return runs + (duel(run, deadline) if limits.confirm_top else 0)


def duel(run: RunContext, deadline: Deadline) -> int:
    """Paired, interleaved rounds (A B, then B A) between the two finalists the export
    hinges on (`duel_pair`), while their measurements cannot tell them apart, until the
    rounds' interval says which is faster or that more rounds cannot move the export
    (`decided`), for at most --confirm-rounds rounds, twice that while the rounds read
    the config that would displace the export ahead (`reads_ahead`), and as far as the
    time budget allows. On a host whose runs of one config drift 8%, bf16's 11-20% gain
    was often not yet significant after 8 rounds: 59 of 240 simulated searches scored
    under 0.95 of the best the rule allows, 18 with up to 16 rounds (40 once the interval
    held at every look, core/stats.NOMINAL: the price of a tie exported as a change in
    2-3% of duels, not 12%)."""
    spec, limits = run.spec, run.limits
    runs, most = 0, limits.confirm_rounds
    for _ in range(2 * most + 1 if most >= 2 else 0):  # a pair that changes: bounded too
        pool = [r for r in fitting(run.store.records(), spec.fit_limit_bytes) if exportable(r)]
        pair = duel_pair(spec, pool, limits.objective)
        if pair is None:
            return runs
        a, b = pair
        ratio = compare(a, b)
        together = len(dict(a.rounds).keys() & dict(b.rounds).keys())
        cap = 2 * most if reads_ahead(a, b, spec, limits.objective) else most
        left = deadline.left()
        if (
            decided(a, b, spec, limits.objective)
            or together >= cap
            or (left is not None and confirm_s(spec, limits, a) + confirm_s(spec, limits, b) > left)
        ):
            if together >= 2 and ratio is not None:
                run.observer.on_plan(
                    f"paired rounds: trial {a.number} against trial {b.number}: {ratio.describe()}"
                )
            return runs
        number = run.store.next_round()
        for record in (a, b) if number % 2 == 0 else (b, a):  # neither always first
            confirm_run(run, record, number, runs)
            runs += 1
    return runs


def confirm_run(run: RunContext, record: TrialRecord, round_number: int, runs: int) -> None:
    """One confirmation run, in its own folder, alone (concurrent 1), stored with its
    round."""
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{round_number}-{runs}"
    limits = run.limits
    config = run.trial_config(
        record.number,
        record.candidate,
        f"{record.number}-confirm-{stamp}",
        concurrent=1,
        measure_steps=limits.confirm_steps,
    )
    result = run.launcher.run(config, timeout_s=limits.trial_timeout_s)
    judged = verdict(result, run.spec, implied=False)
    run.store.add_confirmation(record, result, judged, config.trial_dir, round_number)
    run.observer.on_confirm(record.number, record.candidate, result)
