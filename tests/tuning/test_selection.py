from __future__ import annotations

import dataclasses
import statistics

import pytest
from helpers import GIB, SPACE, SPEC, cand, rec

from autotune.core.enums import Objective, Precision
from autotune.core.parity import Arithmetic
from autotune.core.parity_verdict import Parity, Status
from autotune.core.trial import Candidate, Outcome, TrialRecord
from autotune.tuning.selection import (
    kept_note,
    noise_band,
    ranked,
    select_best,
    unverified_note,
)

LIMIT = 4 * GIB


def test_fastest_that_fits_wins() -> None:
    records = [
        rec(0, cand(8), sps=10.0, peak_gib=1.0),
        rec(1, cand(16), sps=14.0, peak_gib=2.0),
        rec(2, cand(32), sps=20.0, peak_gib=4.5),  # faster, but over the limit
        rec(3, cand(64), Outcome.OOM, peak_gib=5.0),
    ]
    assert select_best(records, fit_limit_bytes=LIMIT).number == 1


def test_ties_within_noise_go_to_less_memory() -> None:
    records = [
        rec(0, cand(16), sps=20.0, peak_gib=3.0, spread=0.10),
        rec(1, cand(8), sps=19.5, peak_gib=1.5, spread=0.10),  # within 0.10/sqrt(5) = 4.5%
        rec(2, cand(8, "bf16"), sps=17.0, peak_gib=1.0, spread=0.10),  # 15% slower: not a tie
    ]
    assert select_best(records, fit_limit_bytes=LIMIT).number == 1


def test_a_noisy_measurement_cannot_make_a_much_slower_config_a_tie() -> None:
    fastest = rec(0, cand(16), sps=20.0, peak_gib=3.0, spread=0.9)
    assert noise_band(fastest) == 0.10
    slower = rec(1, cand(8), sps=15.0, peak_gib=1.0, spread=0.9)
    assert select_best([fastest, slower], fit_limit_bytes=LIMIT).number == 0


def test_efficiency_objective_is_throughput_per_gib() -> None:
    records = [rec(0, cand(16), sps=20.0, peak_gib=4.0), rec(1, cand(8), sps=12.0, peak_gib=1.0)]
    assert select_best(records, fit_limit_bytes=LIMIT, objective="efficiency").number == 1
    assert select_best(records, fit_limit_bytes=LIMIT).number == 0


def test_unstable_and_failed_configs_are_never_selected() -> None:
    records = [
        rec(0, cand(8), Outcome.UNSTABLE, peak_gib=1.0),
        rec(1, cand(16), Outcome.ERROR, peak_gib=None),
        rec(2, cand(32), Outcome.OOM, peak_gib=4.0),
    ]
    assert select_best(records, fit_limit_bytes=LIMIT) is None


def test_ranked_puts_ok_first_by_throughput() -> None:
    records = [rec(0, cand(8), Outcome.OOM), rec(1, cand(16), sps=5.0), rec(2, cand(32), sps=9.0)]
    assert [r.number for r in ranked(records)] == [2, 1, 0]


def test_a_config_fits_within_the_budget_less_the_headroom_not_the_budget() -> None:
    """SPEC: an 8 GiB budget, 5% headroom. A peak between 7.6 and 8 GiB does not fit."""
    from helpers import SPEC

    from autotune.core.trial import TrialResult
    from autotune.tuning.selection import verdict

    def peak(gib: float) -> TrialResult:
        return TrialResult(Outcome.OK, samples_per_s=10.0, peak_memory_bytes=int(gib * GIB))

    assert SPEC.fit_limit_bytes == int(0.95 * SPEC.memory_budget_bytes)
    inside, over = verdict(peak(7.5), SPEC, implied=False), verdict(peak(7.8), SPEC, implied=False)
    assert inside.constraint_gib is not None and inside.constraint_gib <= 0
    assert over.constraint_gib is not None and over.constraint_gib > 0
    between = rec(0, cand(16), sps=20.0, peak_gib=7.8)
    assert (
        select_best(
            [between, rec(1, cand(8), sps=5.0, peak_gib=7.5)], fit_limit_bytes=SPEC.fit_limit_bytes
        ).number
        == 1
    )


def finishing(number: int, one_time_s: float, step_s: float, **changes: object) -> TrialRecord:
    """A record whose run paid `one_time_s` once, then `step_s` per optimizer step."""
    base = rec(number, cand(8 * (number + 1)))
    result = base.result.replace(
        step_time_median_s=step_s,
        samples_per_s=64 / step_s,
        step_times_s=(step_s,) * 5,
        one_time_s=one_time_s,
        **changes,
    )
    return TrialRecord(number, base.candidate, result)


def test_with_the_users_run_length_the_quickest_to_finish_it_wins() -> None:
    """A compiled config: faster steps after a 60 s compilation. It wins a long run and
    loses a short one; without a run length, steady throughput decides."""
    plain, compiled = finishing(0, 0.5, 0.10), finishing(1, 60.0, 0.08)
    records = [plain, compiled]
    assert select_best(records, fit_limit_bytes=8 * GIB) == compiled
    assert select_best(records, fit_limit_bytes=8 * GIB, train_steps=100) == plain
    assert select_best(records, fit_limit_bytes=8 * GIB, train_steps=10_000) == compiled
    assert compiled.result.time_to_finish_s(100) == pytest.approx(68.0)


def _timed(
    number: int, candidate: Candidate, step_s: tuple[float, ...], peak_gib: float
) -> TrialRecord:
    """A record whose speed is its steps' (a global batch of 16 samples a step)."""
    record = rec(number, candidate, sps=16 / statistics.median(step_s), peak_gib=peak_gib)
    result = dataclasses.replace(
        record.result, step_times_s=step_s, step_time_median_s=statistics.median(step_s)
    )
    return dataclasses.replace(record, result=result)


RECIPE = Arithmetic(Precision.FP32, "adamw_torch")
BF16_FUSED = SPACE.candidate(8, "bf16", False, "adamw_torch_fused")


def test_a_tie_keeps_the_recipes_arithmetic_then_the_least_memory() -> None:
    yours = _timed(0, cand(8), (1.00, 1.02, 0.98, 1.01, 0.99), peak_gib=2.0)
    bf16 = _timed(1, BF16_FUSED, (0.99, 1.01, 0.98, 1.00, 1.02), peak_gib=1.0)  # a hair faster
    assert select_best([yours, bf16], fit_limit_bytes=LIMIT).number == 1  # least memory
    assert select_best([yours, bf16], fit_limit_bytes=LIMIT, recipe=RECIPE).number == 0


def test_an_unchecked_change_is_exported_only_when_paired_rounds_confirm_its_gain() -> None:
    yours = _timed(0, cand(8), (1.00, 1.10, 0.95, 1.05, 1.00), peak_gib=2.0)
    # 10% faster by the medians, but the ranges of their steps overlap: not significant
    close = _timed(1, BF16_FUSED, (0.85, 1.04, 0.86, 1.02, 0.91), peak_gib=2.0)
    assert select_best([yours, close], fit_limit_bytes=LIMIT).number == 1
    assert select_best([yours, close], fit_limit_bytes=LIMIT, recipe=RECIPE).number == 0
    # twice as fast, every step, in a run of its own: not confirmed, the recipe is kept
    far = _timed(2, BF16_FUSED, (0.50, 0.52, 0.49, 0.51, 0.50), peak_gib=2.0)
    assert select_best([yours, far], fit_limit_bytes=LIMIT, recipe=RECIPE).number == 0
    # timed beside it in three rounds, twice as fast in each: confirmed
    paired = [
        dataclasses.replace(yours, rounds=_rounds(1.00, 1.02, 1.00)),
        dataclasses.replace(far, rounds=_rounds(0.50, 0.52, 0.50)),
    ]
    assert select_best(paired, fit_limit_bytes=LIMIT, recipe=RECIPE).number == 2
    # two rounds are one degree of freedom: steady as they are, they do not confirm it
    two = [dataclasses.replace(r, rounds=r.rounds[:2]) for r in paired]
    assert select_best(two, fit_limit_bytes=LIMIT, recipe=RECIPE).number == 0
    # verified by parity, the close one wins as the faster, as any config would
    ok = dataclasses.replace(close, parity=Parity(Status.OK))
    assert select_best([yours, ok], fit_limit_bytes=LIMIT, recipe=RECIPE).number == 1


def test_separate_runs_never_decide_an_unchecked_change() -> None:
    """Steady steps in two separate probes, 15% apart with no overlap: separate runs of
    one config drift further apart than that, so without paired rounds the recipe's
    arithmetic is kept (a 1-minute QLoRA search here exported bf16 -> as-loaded for
    1.04x). Paired rounds at the same 15% decide it."""
    yours = _timed(0, cand(8), (1.00, 1.01, 0.99, 1.00, 1.00), peak_gib=2.0)
    steady = _timed(1, BF16_FUSED, (0.87, 0.87, 0.86, 0.87, 0.88), peak_gib=2.0)
    assert select_best([yours, steady], fit_limit_bytes=LIMIT, recipe=RECIPE).number == 0
    paired = [
        dataclasses.replace(yours, rounds=_rounds(1.00, 1.02, 0.99, 1.01)),
        dataclasses.replace(steady, rounds=_rounds(0.87, 0.88, 0.86, 0.88)),
    ]
    assert select_best(paired, fit_limit_bytes=LIMIT, recipe=RECIPE).number == 1


def test_the_export_says_which_faster_change_a_tie_passed_over() -> None:
    """The recipe kept over a bf16 probe 15% faster in separate runs: the export says so
    in one line, with the gain that did not count and the change it would have made;
    nothing is said where the change was taken or nothing faster was passed over."""
    yours = _timed(0, cand(8), (1.00, 1.01, 0.99, 1.00, 1.00), peak_gib=2.0)
    steady = _timed(1, BF16_FUSED, (0.87, 0.87, 0.86, 0.87, 0.88), peak_gib=2.0)
    line = kept_note(SPEC, [yours, steady], yours)
    assert line.startswith("kept your arithmetic: trial 1 (batch ")
    assert "1.15x" in line and "in separate runs, a gain not confirmed in paired rounds" in line
    assert "(precision fp32 -> bf16), which parity left unchecked;" in line
    slower = _timed(2, BF16_FUSED, (1.20,) * 5, peak_gib=2.0)
    assert kept_note(SPEC, [yours, slower], yours) == ""
    far = _timed(3, BF16_FUSED, (0.50, 0.52, 0.49, 0.51, 0.50), peak_gib=2.0)
    assert kept_note(SPEC, [yours, far], far) == ""  # the change was exported


def test_the_export_says_why_an_unverified_change_was_taken() -> None:
    yours = _timed(0, cand(8), (1.00, 1.10, 0.95, 1.05, 1.00), peak_gib=2.0)
    far = _timed(2, BF16_FUSED, (0.50, 0.52, 0.49, 0.51, 0.50), peak_gib=2.0)
    line = unverified_note(SPEC, [yours, far], far)
    assert line.startswith("exported without verified parity for its gain: 2.0")
    assert "trial 0 (batch 8x8 fp32 no-ckpt adamw_torch), the best that keeps" in line
    assert unverified_note(SPEC, [yours, far], yours) == ""
    # with no config of the recipe's arithmetic fitting: measured out of memory, or never
    # measured (a budget that ran out first) are not the same news
    oom = rec(3, cand(8), Outcome.OOM, peak_gib=5.0)
    assert unverified_note(SPEC, [oom, far], far).endswith(
        "none of the configs that keep your recipe's precision and optimizer it measured fit "
        "(trial 3, batch 8x8 fp32 no-ckpt adamw_torch: out of memory)"
    )
    assert unverified_note(SPEC, [far], far).endswith("was measured before the time budget ran out")


def test_an_unverified_best_has_its_arithmetic_keeping_twin_probed_next() -> None:
    """The tie and the significance rules weigh a change against the best config that
    keeps the arithmetic: the best's own split and levers with the recipe's precision
    and optimizer is the one to measure."""
    from autotune.tuning._skips import open_candidates
    from autotune.tuning.selection import keeping_twin

    spec = dataclasses.replace(SPEC, memory_budget_bytes=8 * GIB)
    yours = _timed(0, cand(8), (1.0,) * 5, peak_gib=2.0)
    fast = _timed(1, SPACE.candidate(32, "bf16", True, "adamw_torch"), (0.5,) * 5, peak_gib=2.0)
    twin = keeping_twin(spec, [yours, fast])
    assert twin == SPACE.candidate(32, "fp32", True, "adamw_torch")
    assert twin in open_candidates(spec.space, [yours, fast])  # the search probes it next
    measured = _timed(2, twin, (0.6,) * 5, peak_gib=2.0)
    assert twin not in open_candidates(spec.space, [yours, fast, measured])  # once
    verified = dataclasses.replace(fast, parity=Parity(Status.OK))
    assert keeping_twin(spec, [yours, verified]) is None


def test_a_twin_memory_shuts_is_probed_at_the_split_or_checkpointing_that_fits() -> None:
    """On an H200 a 1.24B Llama's search measured fp32 only at the plain default, out of
    memory, and exported bf16 as if no fp32 config fit. Where the best changes the
    recipe's arithmetic and its keeping twin is shut for memory, the configs the search
    probes next are that twin at a smaller batch or checkpointed: its recipe's arithmetic
    and levers, nothing else; once one of them fits, the search is free again."""
    from autotune.tuning._skips import open_candidates
    from autotune.tuning.selection import keeping_twin, twin_variants

    plain = rec(0, cand(8), Outcome.OOM, peak_gib=8.0)
    fast = rec(1, cand(8, "bf16"), sps=30.0, peak_gib=5.0)
    records = [plain, fast]
    twin = keeping_twin(SPEC, records)
    assert twin == cand(8)
    opened = open_candidates(SPACE, records)
    assert twin not in opened  # measured out of memory
    variants = twin_variants(SPEC, records, twin, opened)
    assert {cand(8, ckpt=True), cand(4)} <= set(variants)  # checkpointed; a smaller split
    assert {cand(b) for b in (16, 32, 64)}.isdisjoint(variants)  # out of memory at 8 already
    assert all(Arithmetic.of(c) == RECIPE and c.levers == twin.levers for c in variants)
    fitted = rec(2, cand(8, ckpt=True), sps=12.0, peak_gib=3.0)
    assert twin_variants(SPEC, [*records, fitted], twin, opened) == []
    # and the export says what was measured, not that no such config could fit
    line = unverified_note(SPEC, records, fast)
    assert "(trial 0, batch 8x8 fp32 no-ckpt adamw_torch: out of memory)" in line


def test_a_config_is_made_to_keep_the_recipes_arithmetic_with_its_batch_and_levers() -> None:
    """fp32 for bf16; fused AdamW stays (AdamW's update), Adafactor becomes the recipe's
    AdamW; batch, split, checkpointing and attention stay."""
    from autotune.tuning.selection import keeping

    fused = dataclasses.replace(cand(16, "bf16", ckpt=True), optim="adamw_torch_fused")
    assert keeping(SPEC, fused) == dataclasses.replace(fused, precision=Precision.FP32)
    adafactor = dataclasses.replace(cand(4, "bf16"), optim="adafactor")
    assert keeping(SPEC, adafactor) == cand(4)
    assert keeping(SPEC, cand(8)) == cand(8)  # keeps it already


def test_packed_rows_are_a_change_exported_only_for_a_significant_gain() -> None:
    """Packed rows train several samples a step: whatever its precision and optimizer,
    a packed config changes the recipe's training, parity cannot pair it (unchecked),
    and it is exported only where its gain clears the drift of separate runs; the
    config a tie goes to is its own unpacked twin."""
    from autotune.core.parity import UNPAIRED
    from autotune.tuning.selection import keeping_twin

    packed = dataclasses.replace(cand(8), packing=True)
    assert Arithmetic.of(packed) != RECIPE and Arithmetic.of(packed).key.endswith("|packed")
    yours = _timed(0, cand(8), (1.00, 1.01, 0.99, 1.00, 1.00), peak_gib=2.0)
    close = dataclasses.replace(
        _timed(1, packed, (0.87, 0.87, 0.86, 0.87, 0.88), peak_gib=2.0), parity=UNPAIRED
    )
    assert select_best([yours, close], fit_limit_bytes=LIMIT, recipe=RECIPE).number == 0
    far = dataclasses.replace(close, number=2, result=_timed(2, packed, (0.5,) * 5, 2.0).result)
    assert select_best([yours, far], fit_limit_bytes=LIMIT, recipe=RECIPE).number == 0
    yours, far = (
        dataclasses.replace(yours, rounds=_rounds(1.0, 1.01, 1.0)),
        dataclasses.replace(far, rounds=_rounds(0.5, 0.51, 0.5)),
    )
    assert select_best([yours, far], fit_limit_bytes=LIMIT, recipe=RECIPE).number == 2
    assert unverified_note(SPEC, [yours, far], far).startswith(
        "exported without verified parity for its gain: 1.99x (1.92-2.06x over 3 paired rounds)"
    )
    assert keeping_twin(dataclasses.replace(SPEC, memory_budget_bytes=8 * GIB), [yours, far]) == (
        cand(8)
    )


def _rounds(*step_s: float, start: int = 0) -> tuple[tuple[int, float], ...]:
    return tuple(enumerate(step_s, start=start))


def test_paired_rounds_decide_what_pooled_steps_cannot() -> None:
    """The unchecked bf16 change reads 10% faster, its steps overlapping the recipe's:
    not significant from pooled steps. Timed beside it in four rounds, 9-11% faster in
    every one, its gain holds and it is exported; rounds that swing either way leave it a
    tie, and the recipe's arithmetic is kept."""
    yours = _timed(0, cand(8), (1.00, 1.10, 0.95, 1.05, 1.00), peak_gib=2.0)
    close = _timed(1, BF16_FUSED, (0.85, 1.04, 0.86, 1.02, 0.91), peak_gib=2.0)
    steady = [
        dataclasses.replace(yours, rounds=_rounds(1.00, 1.05, 0.98, 1.02)),
        dataclasses.replace(close, rounds=_rounds(0.91, 0.95, 0.88, 0.93)),
    ]
    assert select_best(steady, fit_limit_bytes=LIMIT, recipe=RECIPE).number == 1
    assert "over 4 paired rounds" in unverified_note(SPEC, steady, steady[1])
    swinging = [
        dataclasses.replace(yours, rounds=_rounds(1.00, 1.05, 0.98, 1.02)),
        dataclasses.replace(close, rounds=_rounds(0.80, 1.10, 0.85, 1.06)),
    ]
    assert select_best(swinging, fit_limit_bytes=LIMIT, recipe=RECIPE).number == 0


def test_a_gain_the_duel_ends_on_as_significant_is_exported() -> None:
    """Paired rounds put the bf16 change 1.08x (1.04-1.12x over 5 rounds) the recipe:
    significant, which ends the duel between them; selection must read those rounds
    alike and export the change. It read them as a tie (an edge under 1%) and kept
    fp32, in 7 of 24 simulated t5 searches, at 0.86 of the best the rule allows."""
    from autotune.tuning.selection import decided, duel_pair, significant

    spec = dataclasses.replace(SPEC, recipe_settings={"optim": "adamw_torch"})
    yours = _timed(0, cand(8), (1.00, 1.02, 0.98, 1.01, 0.99), peak_gib=2.0)
    bf16 = _timed(1, BF16_FUSED, (0.93, 0.95, 0.91, 0.94, 0.92), peak_gib=2.0)
    pool = [
        dataclasses.replace(yours, rounds=_rounds(1.00, 1.00, 1.00, 1.00, 1.00)),
        dataclasses.replace(bf16, rounds=_rounds(0.93, 0.95, 0.91, 0.94, 0.92)),
    ]
    assert significant(pool[1], pool[0], Objective.THROUGHPUT)
    pair = duel_pair(spec, pool, Objective.THROUGHPUT)
    assert pair is not None and [r.number for r in pair] == [1, 0]
    assert decided(*pair, spec, Objective.THROUGHPUT)
    chosen = select_best(pool, fit_limit_bytes=LIMIT, recipe=RECIPE)
    assert chosen is not None and chosen.number == 1
    # two of one arithmetic: an edge the rounds show under 1% is still a tie, and the
    # leaner one is taken
    quick = _timed(2, cand(8), (0.93, 0.95, 0.91, 0.94, 0.92), peak_gib=2.0)
    lean = _timed(3, cand(16), (1.00, 1.02, 0.98, 1.01, 0.99), peak_gib=1.0)
    same = [
        dataclasses.replace(quick, rounds=_rounds(0.93, 0.95, 0.91)),
        dataclasses.replace(lean, rounds=_rounds(1.00, 1.00, 1.00)),
    ]
    chosen = select_best(same, fit_limit_bytes=LIMIT, recipe=RECIPE)
    assert chosen is not None and chosen.number == 3


@pytest.mark.parametrize("objective", list(Objective))
@pytest.mark.parametrize("train_steps", [0, 1000])
def test_every_objective_reads_the_rounds_that_end_the_duel(
    objective: Objective, train_steps: int
) -> None:
    """Pooled runs read the bf16 change level with the recipe; paired rounds put it 4-5%
    faster every round, which ends their duel. By efficiency and by the time to finish
    the user's run selection read only the pooled runs, called the two a tie and kept
    fp32 after the duel had stopped on the gain; it exports the change now. Rounds that
    swing either way still keep the recipe."""
    from autotune.tuning.selection import decided, duel_pair

    spec = dataclasses.replace(
        SPEC, recipe_settings={"optim": "adamw_torch"}, train_steps=train_steps
    )
    steps = (1.00, 1.10, 0.95, 1.05, 1.00)
    yours = dataclasses.replace(
        _timed(0, cand(8), steps, peak_gib=2.0), rounds=_rounds(1.0, 1.0, 1.0, 1.0)
    )
    level = _timed(1, BF16_FUSED, steps, peak_gib=2.0)
    bf16 = dataclasses.replace(level, rounds=_rounds(0.95, 0.96, 0.95, 0.96))
    pair = duel_pair(spec, [yours, bf16], objective)
    assert pair is not None and [r.number for r in pair] == [1, 0]
    assert decided(*pair, spec, objective)
    chosen = select_best(
        [yours, bf16],
        fit_limit_bytes=LIMIT,
        objective=objective,
        train_steps=train_steps,
        recipe=RECIPE,
    )
    assert chosen is not None and chosen.number == 1
    swinging = dataclasses.replace(level, rounds=_rounds(0.90, 1.08, 0.93, 1.06))
    chosen = select_best(
        [yours, swinging],
        fit_limit_bytes=LIMIT,
        objective=objective,
        train_steps=train_steps,
        recipe=RECIPE,
    )
    assert chosen is not None and chosen.number == 0


def test_the_duel_is_between_the_export_and_the_config_it_would_yield_to() -> None:
    from autotune.core.stats import SpeedRatio
    from autotune.tuning.selection import decided, duel_pair, settled

    spec = dataclasses.replace(SPEC, recipe_settings={"optim": "adamw_torch"})
    yours = _timed(0, cand(8), (1.00, 1.10, 0.95, 1.05, 1.00), peak_gib=2.0)
    close = _timed(1, BF16_FUSED, (0.85, 1.04, 0.86, 1.02, 0.91), peak_gib=2.0)
    slower = _timed(2, cand(16), (1.2, 1.3, 1.25, 1.2, 1.3), peak_gib=1.0)
    pair = duel_pair(spec, [yours, close, slower], Objective.THROUGHPUT)
    assert pair is not None and {r.number for r in pair} == {0, 1}
    assert duel_pair(spec, [yours], Objective.THROUGHPUT) is None
    # by efficiency too, where the leader changes the arithmetic unverified
    assert [r.number for r in duel_pair(spec, [yours, close], Objective.EFFICIENCY)] == [1, 0]  # type: ignore[union-attr]
    # one arithmetic, by efficiency: the export (the leaner 16x4) and its rival by the
    # objective; their peaks, 1 GiB against 2, decide it without rounds
    lean = duel_pair(spec, [yours, slower], Objective.EFFICIENCY)
    assert lean is not None and [r.number for r in lean] == [2, 0]
    assert decided(*lean, spec, Objective.EFFICIENCY)
    assert not settled(None) and settled(SpeedRatio(1.1, 1.05, 1.15))  # one is faster
    assert not settled(SpeedRatio(1.0, 0.9, 1.1))  # pooled steps that overlap
    assert not settled(SpeedRatio(1.0, 0.9, 1.1, rounds=3))  # rounds, still wide
    assert settled(SpeedRatio(1.0, 0.99, 1.015, rounds=5))  # a tie within 2%
    # Where the export hinges on a significant gain (the two differ in arithmetic), runs
    # not side by side never decide: twice as fast in separate runs, the duel goes on
    twice = _timed(3, BF16_FUSED, (0.50, 0.52, 0.49, 0.51, 0.50), peak_gib=2.0)
    assert not decided(twice, yours, spec, Objective.THROUGHPUT)
    paired = dataclasses.replace(twice, rounds=_rounds(0.50, 0.52))
    assert decided(
        paired, dataclasses.replace(yours, rounds=_rounds(1.0, 1.03)), spec, Objective.THROUGHPUT
    )


def test_the_duel_ends_once_more_rounds_cannot_move_the_export_by_2_percent() -> None:
    """A change is exported only on a significant gain: once its rounds put the gain at
    most 2% (a tie of 0.95-1.01x over 8 rounds), more rounds could only find a gain too small to
    matter, and the recipe's config is exported. The duel stops there; it goes on while
    the gain may still be larger. Two of one arithmetic likewise: once the rival is at
    most 2% better than the export, however much slower it may be."""
    from autotune.tuning.selection import decided

    spec = dataclasses.replace(SPEC, recipe_settings={"optim": "adamw_torch"})
    steps = (1.00, 1.02, 0.98, 1.01, 0.99)
    yours = dataclasses.replace(
        _timed(0, cand(8), steps, peak_gib=2.0), rounds=_rounds(*(1.0,) * 8)
    )

    def change(*step_s: float) -> TrialRecord:
        return dataclasses.replace(
            _timed(1, BF16_FUSED, steps, peak_gib=2.0), rounds=_rounds(*step_s)
        )

    slower = change(1.04, 0.99, 1.05, 1.00, 1.03, 1.04, 1.00, 1.03)
    assert decided(slower, yours, spec, Objective.THROUGHPUT)
    assert not decided(change(0.96, 1.04, 0.97, 1.03, 1.00), yours, spec, Objective.THROUGHPUT)
    # the recipe's config ahead, the change its rival: at most 1% slower than it, and
    # perhaps 5% faster: a gain the export would yield to, so the duel goes on
    assert not decided(yours, change(0.96, 1.01, 0.95, 1.00, 0.97), spec, Objective.THROUGHPUT)
    rival = dataclasses.replace(_timed(2, cand(16), steps, peak_gib=1.0), rounds=yours.rounds)
    ahead = dataclasses.replace(yours, rounds=_rounds(0.95, 1.00, 0.96, 0.99, 0.97))
    assert decided(ahead, rival, spec, Objective.THROUGHPUT)  # -1% to +6%: a tie, settled
    swinging = dataclasses.replace(yours, rounds=_rounds(0.95, 1.06, 0.97, 1.04, 1.00))
    assert not decided(swinging, rival, spec, Objective.THROUGHPUT)


def test_the_duel_goes_to_the_rival_the_objective_names() -> None:
    """For a run of 100 steps, the compiled config is the fastest but the slowest to
    finish (60 s of compilation): the export's rival is the one whose time to finish is
    next, not the fastest. A confirmation of the compiled one cannot change the export,
    and the finalists the confirmation runs are in the objective's order."""
    from autotune.tuning.selection import by_objective, decided, duel_pair

    plain, compiled = finishing(0, 0.5, 0.10), finishing(1, 60.0, 0.08)
    near = finishing(2, 0.5, 0.102)
    pool = [plain, compiled, near]
    spec = dataclasses.replace(SPEC, train_steps=100, memory_budget_bytes=8 * GIB)
    pair = duel_pair(spec, pool, Objective.THROUGHPUT)
    assert pair is not None and [r.number for r in pair] == [0, 2]
    assert [r.number for r in by_objective(pool, Objective.THROUGHPUT, 100)] == [0, 2, 1]
    assert [r.number for r in by_objective(pool, Objective.THROUGHPUT)] == [1, 0, 2]
    # 2% apart over steps that do not vary: their separate runs already tell them apart
    assert decided(plain, near, spec, Objective.THROUGHPUT)


def _steps_at(sps: float, spread: float = 0.03) -> tuple[float, ...]:
    """Five steady steps of a global batch of 16 at `sps` samples/s, `spread` apart."""
    step = 16 / sps
    return tuple(step * (1 + spread * k / 2) for k in (-2, -1, 0, 1, 2))


def test_one_reading_of_a_change_never_changes_the_users_arithmetic() -> None:
    """As read on two processes: bf16 Adafactor at 8x2 once, 69.46 samples/s, 1.33x
    (1.28-1.43x over its steps) the best fp32 fused AdamW config (60.06 in its probe,
    47.78 in its confirmation), while another change read 75.46 and then 55.24 (27%
    lower). Without paired rounds the recipe's arithmetic is exported, whatever the
    objective, and the export says the change was not confirmed; rounds that confirm the
    gain export it, rounds that do not keep the recipe."""
    spec = dataclasses.replace(SPEC, recipe_settings={"optim": "adamw_torch_fused"})
    fused = SPACE.candidate(8, "fp32", False, "adamw_torch_fused")
    recipe = Arithmetic.of(fused)  # fused AdamW computes as AdamW does
    keeping = _timed(0, fused, _steps_at(60.06) + _steps_at(47.78), peak_gib=2.0)
    adafactor = _timed(1, SPACE.candidate(8, "bf16", False, "adafactor"), _steps_at(69.46), 2.0)
    drifting = _timed(
        2,
        SPACE.candidate(16, "bf16", False, "adamw_torch"),
        _steps_at(75.46) + _steps_at(55.24),
        2.0,
    )
    pool = [keeping, adafactor, drifting]
    for objective in Objective:
        chosen = select_best(pool, fit_limit_bytes=LIMIT, objective=objective, recipe=recipe)
        assert chosen is not None and chosen.number == 0, objective
    line = kept_note(spec, pool, keeping)
    assert line.startswith("kept your arithmetic: trial 2 (batch 16x4 bf16")
    assert "in separate runs, a gain not confirmed in paired rounds" in line
    # the duel pairs the leading change with the best config that keeps the arithmetic
    from autotune.tuning.selection import duel_pair

    for objective in (Objective.THROUGHPUT, Objective.EFFICIENCY):
        pair = duel_pair(spec, pool, objective)
        assert pair is not None and [r.number for r in pair] == [2, 0], objective
    confirmed = [
        dataclasses.replace(keeping, rounds=_rounds(0.33, 0.34, 0.335)),
        adafactor,
        dataclasses.replace(drifting, rounds=_rounds(0.27, 0.275, 0.27)),
    ]
    chosen = select_best(confirmed, fit_limit_bytes=LIMIT, recipe=recipe)
    assert chosen is not None and chosen.number == 2
    swinging = [
        dataclasses.replace(keeping, rounds=_rounds(0.33, 0.34, 0.335)),
        adafactor,
        dataclasses.replace(drifting, rounds=_rounds(0.27, 0.36, 0.30)),
    ]
    chosen = select_best(swinging, fit_limit_bytes=LIMIT, recipe=recipe)
    assert chosen is not None and chosen.number == 0


def test_a_confirmed_gain_is_read_by_the_objective() -> None:
    """Efficiency: the same speed in paired rounds at half the peak is twice the samples/s
    per GiB (the peaks are measured; the speed is what drifts). Time to finish: paired
    rounds 10% faster, but a one-time cost that outweighs it over the user's 20 steps."""
    from autotune.tuning.selection import paired_gain, significant

    yours = dataclasses.replace(
        _timed(0, cand(8), (1.0,) * 5, peak_gib=2.0), rounds=_rounds(1.0, 1.01, 0.99)
    )
    lean = dataclasses.replace(
        _timed(1, BF16_FUSED, (1.0,) * 5, peak_gib=1.0), rounds=_rounds(1.0, 1.0, 1.0)
    )
    assert not significant(lean, yours, Objective.THROUGHPUT)
    assert significant(lean, yours, Objective.EFFICIENCY)
    quick = dataclasses.replace(lean, rounds=_rounds(0.9, 0.91, 0.9))
    assert significant(quick, yours, Objective.THROUGHPUT)
    slow_start = dataclasses.replace(
        quick, result=dataclasses.replace(quick.result, one_time_s=10.0)
    )
    gain = paired_gain(slow_start, yours, Objective.THROUGHPUT, train_steps=20)
    assert gain is not None and gain.value < 1.0
    assert not significant(slow_start, yours, Objective.THROUGHPUT, train_steps=20)
