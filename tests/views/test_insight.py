"""What a study means: ties, the reference, what changed, each trial's note."""

from __future__ import annotations

from helpers import SPEC, cand, rec

from autotune.views.insight import insight, note


def test_the_winner_its_ties_and_what_it_changes_against_the_recipe() -> None:
    records = [
        rec(0, cand(8), sps=10.0, peak_gib=1.0),  # the plain default: fp32, batch 8
        rec(1, cand(16, "bf16"), sps=20.0, peak_gib=2.0, spread=0.1),
        rec(2, cand(32, "bf16", ckpt=True), sps=19.9, peak_gib=1.5),  # a tie, less memory
        rec(3, cand(32), sps=12.0, peak_gib=3.0),
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
    taken = dataclasses.replace(taken, runs=2, result=taken.result.replace(
        phases_s={"wall": 40.0}, reused_from="study a trial 3", pooled_runs=2))  # fmt: skip
    found = insight([ran, taken], SPEC)
    assert (found.probes, found.probe_seconds) == (1, 30.0)
