"""What a study means: ties, the reference, what changed, each trial's note."""

from __future__ import annotations

from helpers import SPEC, cand, rec

from autotune.core.trial import TrialRecord
from autotune.views._insight import insight, note


def test_the_winner_its_ties_and_what_it_changes_against_the_recipe() -> None:
    import dataclasses

    # trial 2's bf16 gain over the best fp32 config, 3, confirmed in paired rounds
    records = [
        rec(0, cand(8), sps=10.0, peak_gib=1.0),  # the plain default: fp32, batch 8
        rec(1, cand(16, "bf16"), sps=20.0, peak_gib=2.0, spread=0.1),
        dataclasses.replace(  # a tie, less memory
            rec(2, cand(32, "bf16", ckpt=True), sps=19.9, peak_gib=1.5),
            rounds=((0, 0.05), (1, 0.051)),
        ),
        dataclasses.replace(
            rec(3, cand(32), sps=12.0, peak_gib=3.0), rounds=((0, 0.083), (1, 0.084))
        ),
    ]
    found = insight(records, SPEC)
    assert found.best is not None and found.best.number == 2  # the tie with less memory
    assert found.reference is not None and found.reference.number == 0
    assert set(found.ties) == {1, 2}
    altered = {c.describe() for c in found.changes if not c.keeps_arithmetic}
    kept = {c.describe() for c in found.changes if c.keeps_arithmetic}
    assert altered == {"precision fp32 -> bf16"}
    # The recipe (no --base-args): fp32 adamw_torch at the largest micro-batch that fits.
    assert kept == {"checkpointing off -> on"}
    assert note(records[2], found) == "selected"
    assert note(records[1], found).startswith("tie: within")
    assert note(records[3], found) == "40% slower"


def test_the_probing_cost_counts_what_this_study_ran_not_what_it_reused() -> None:
    import dataclasses

    ran = rec(0, cand(8), sps=10.0)
    ran = dataclasses.replace(ran, result=ran.result.replace(phases_s={"wall": 30.0}))
    taken = rec(1, cand(16), sps=12.0)
    taken = dataclasses.replace(
        taken,
        runs=2,
        result=taken.result.replace(
            phases_s={"wall": 40.0}, reused_from="study a trial 3", pooled_runs=2
        ),
    )
    found = insight([ran, taken], SPEC)
    assert (found.probes, found.probe_seconds) == (1, 30.0)


def test_ties_and_how_much_slower_are_judged_as_selection_ranks() -> None:
    """By the quiet step time, as selection judged: a probe that caught a slow spell
    (median 1.5 s, quiet steps 1.0 s) ties with a calm 1.0 s config and, using less
    memory, is selected; a config at 1.3 s reads 23% slower (by the medians, faster)."""
    import dataclasses

    from autotune.core.stats import StepStats

    def timed(number: int, batch: int, times: list[float], peak_gib: float) -> TrialRecord:
        stats = StepStats.of(times)
        r = rec(number, cand(batch, "bf16"), sps=64 / stats.median_s, peak_gib=peak_gib)
        return dataclasses.replace(
            r,
            result=r.result.replace(
                step_time_median_s=stats.median_s,
                step_time_quiet_s=stats.quiet_s,
                step_times_s=tuple(times),
                step_time_spread=stats.spread,
            ),
        )

    calm = timed(1, 16, [1.0] * 8, peak_gib=2.0)
    caught = timed(2, 8, [1.0, 1.0, 1.0, 1.5, 1.5, 1.5, 1.5, 1.5], peak_gib=1.0)
    slow = timed(3, 32, [1.3] * 8, peak_gib=0.5)
    found = insight([calm, caught, slow], SPEC)
    assert found.best is not None and found.best.number == 2  # the tie using less memory
    assert set(found.ties) == {1, 2}
    assert note(calm, found).startswith("tie: within")
    assert note(slow, found) == "23% slower"
