from __future__ import annotations

import dataclasses

import pytest
from helpers import DIMENSIONS, MEMORY_FREE, SPACE, cand, rec

from autotune.core.trial import LEVERS, Candidate, Outcome, TrialRecord
from autotune.tuning._skips import open_candidates, skip_reason


def test_larger_batches_of_an_oom_family_are_skipped_with_the_trial_that_implies_it() -> None:
    records = [rec(4, cand(32), Outcome.OOM, peak_gib=5.0)]
    skip = skip_reason(cand(64), records, SPACE)
    assert skip is not None and skip.implies_oom
    assert skip.reason == "skipped: batch 32 OOM in trial 4"


def test_smaller_batches_and_other_families_are_not_skipped() -> None:
    records = [rec(4, cand(32), Outcome.OOM, peak_gib=5.0)]
    assert skip_reason(cand(16), records, SPACE) is None
    assert skip_reason(cand(64, "bf16"), records, SPACE) is None
    assert skip_reason(cand(64, "fp32", ckpt=True), records, SPACE) is None


def test_measured_configs_are_never_rerun() -> None:
    records = [rec(2, cand(16), Outcome.OK), rec(3, cand(8), Outcome.TIMEOUT, sps=None)]
    assert skip_reason(cand(16), records, SPACE).reason == "duplicate of trial 2"
    assert skip_reason(cand(8), records, SPACE).reason == "duplicate of trial 3"


def test_fallback_batches_open_only_once_8_runs_out_of_memory() -> None:
    skip = skip_reason(cand(4), [], SPACE)
    assert skip is not None and not skip.implies_oom and "fallback" in skip.reason
    records = [rec(1, cand(8), Outcome.OOM, peak_gib=5.0)]
    assert skip_reason(cand(4), records, SPACE) is None
    other_family = skip_reason(cand(4, "bf16"), records, SPACE)  # bf16 at 8 is not known OOM
    assert other_family is not None and "fallback" in other_family.reason


class Says:
    """A memory estimate that says exactly these configs will not fit."""

    def __init__(self, *too_big: Candidate) -> None:
        self.too_big = set(too_big)

    def __call__(self, candidate: Candidate) -> str | None:
        return None

    def fits(self, candidate: Candidate) -> bool:
        return candidate not in self.too_big


def test_fallback_batches_open_once_the_estimate_says_8_will_not_fit() -> None:
    """Where memory binds, waiting for each family's own OOM at 8 spent a probe per
    family and left most families' fallbacks unexplored (the families benchmark: the
    best config, batch 4 in bf16, never probed in 8 probes)."""
    records = [rec(1, cand(8), Outcome.OOM, peak_gib=5.0)]
    assert skip_reason(cand(4, "bf16"), records, SPACE, Says(cand(8, "bf16"))) is None
    assert (
        skip_reason(cand(2, "bf16", ckpt=True), records, SPACE, Says(cand(8, "bf16"))) is not None
    )
    assert skip_reason(cand(4, "bf16"), records, SPACE, Says(cand(16, "bf16"))) is not None
    left = open_candidates(SPACE, records, Says(cand(8, "bf16")))
    assert {cand(b, "bf16") for b in (1, 2, 4)} <= set(left)


def test_the_estimate_opens_no_fallback_it_says_fits_no_better_or_that_8_was_measured_to_fit() -> (
    None
):
    """A fallback opens only where the estimate says 8 will not fit and it will; a
    measurement of 8 that fitted outranks the estimate."""
    records = [rec(1, cand(8), Outcome.OOM, peak_gib=5.0)]
    both = Says(cand(8, "bf16"), cand(4, "bf16"))
    assert skip_reason(cand(4, "bf16"), records, SPACE, both) is not None
    measured = [*records, rec(2, cand(8, "bf16"), Outcome.OK)]
    assert skip_reason(cand(4, "bf16"), measured, SPACE, Says(cand(8, "bf16"))) is not None


def test_the_fitted_estimate_opens_the_fallbacks_of_a_family_whose_8_cannot_fit() -> None:
    """The real verdict: one clean probe at batch 2 fits the activation term; a budget
    between its batch-2 and batch-8 predictions opens bf16's fallbacks, a roomy one not."""
    import dataclasses

    from helpers import SPEC

    from autotune.tuning._memory_verdict import far_over_budget

    spec = dataclasses.replace(SPEC, parameters=10_000_000)
    records = [rec(1, cand(2), Outcome.OK, peak_gib=3.0)]
    predict = far_over_budget(spec, records).predict
    low, high = predict(cand(2, "bf16")), predict(cand(8, "bf16"))
    assert low is not None and high is not None and low < high
    tight = dataclasses.replace(spec, memory_budget_bytes=int((low + high) / 2 / 0.95))
    assert skip_reason(cand(4, "bf16"), records, SPACE, far_over_budget(tight, records)) is None
    roomy = dataclasses.replace(spec, memory_budget_bytes=int(2 * high / 0.95))
    closed = skip_reason(cand(4, "bf16"), records, SPACE, far_over_budget(roomy, records))
    assert closed is not None and "estimated not to fit" in closed.reason


def test_open_candidates_shrink_as_the_study_learns() -> None:
    everything = len(open_candidates(SPACE, []))
    assert everything == SPACE.size
    records = [rec(1, cand(8), Outcome.OOM, peak_gib=5.0)]
    left = open_candidates(SPACE, records)
    # fp32/no-ckpt: 8 measured, 16-64 implied OOM, 1-4 now open.
    assert cand(16) not in left and cand(8) not in left and cand(4) in left
    assert len(left) == everything - 4 + 3


def test_a_config_the_estimate_puts_far_over_the_budget_is_skipped_as_infeasible() -> None:
    """SPEC's model given 1e9 parameters (the largest tensor 250M), 8 GiB: fp16 Adafactor
    (6 + 4 + 1 bytes each, 10.2 GiB) with backward's end (the tied embedding's three
    copies, 2.8 GiB) and the process is 13.4 GiB, far over, though its certain floor (fp32
    weights and gradients, 7.5 GiB) is not over; a 1e8 model is not skipped."""
    import dataclasses

    from helpers import SPEC

    from autotune.tuning._memory_verdict import far_over_budget

    big = dataclasses.replace(SPEC, parameters=1_000_000_000, largest_parameter=250_000_000)
    adafactor = SPACE.candidate(8, "fp16", False, "adafactor")
    over = far_over_budget(big, [])
    assert "far over the 8.0 GiB budget" in str(over(adafactor))
    skip = skip_reason(adafactor, [], SPACE, over)
    assert skip is not None and skip.implies_oom and skip.reason.startswith("skipped: estimate")
    small = far_over_budget(dataclasses.replace(SPEC, parameters=100_000_000), [])
    assert small(cand(64)) is None
    assert far_over_budget(SPEC, [])(cand(8)) is None  # no parameter count: no verdict


def test_a_config_whose_states_alone_exceed_what_a_probe_may_use_is_never_probed() -> None:
    """300M parameters under a 4 GiB budget: AdamW's fp32 weights, gradients and state take
    4.5 GiB for certain, whatever the precision, yet the 1.5x margin of the planning
    estimate would have probed each (an OOM apiece). Adafactor (factored), 8-bit Adam
    (2 bytes) and paged state (may sit in host memory) stay open."""
    import dataclasses

    from helpers import SPEC

    from autotune.tuning._memory_verdict import far_over_budget

    mt5 = dataclasses.replace(SPEC, parameters=300_000_000, memory_budget_bytes=4 * 2**30)
    over = far_over_budget(mt5, [])
    for precision in ("fp32", "bf16", "fp16"):
        for optim in ("adamw_torch", "adamw_torch_fused"):
            why = over(SPACE.candidate(8, precision, True, optim))
            assert why is not None and why.startswith("weights, gradients and optimizer state")
            assert "4.5 GiB, over the 3.8 GiB a probe may use" in why
    for optim in ("adafactor", "adamw_bnb_8bit", "paged_adamw_8bit"):
        assert over(SPACE.candidate(8, "fp32", True, optim)) is None, optim
    roomy = far_over_budget(dataclasses.replace(mt5, memory_budget_bytes=5 * 2**30), [])
    assert roomy(SPACE.candidate(8, "fp32", True, "adamw_torch")) is None


def test_a_config_another_worker_is_probing_is_not_proposed_again() -> None:
    busy = {cand(16): 7}
    skip = skip_reason(cand(16), [], SPACE, in_flight=busy)
    assert skip is not None and not skip.implies_oom and skip.reason == "trial 7 is probing it"
    assert cand(16) not in open_candidates(SPACE, [], in_flight=busy)
    assert cand(16) in open_candidates(SPACE, [])


OPTIMIZERS = dataclasses.replace(
    SPACE, optimizers=("adamw_torch", "adamw_torch_fused", "adafactor")
)


def with_optim(batch: int, optim: str, precision: str = "bf16") -> Candidate:
    return OPTIMIZERS.candidate(batch, precision, False, optim)


def test_an_oom_with_a_lighter_optimizer_implies_the_heavier_ones_at_that_batch() -> None:
    records = [rec(4, with_optim(16, "adafactor"), Outcome.OOM, peak_gib=5.0)]
    for optim in ("adamw_torch", "adamw_torch_fused"):
        for batch in (16, 32):
            skip = skip_reason(with_optim(batch, optim), records, OPTIMIZERS)
            assert skip is not None and skip.implies_oom
            assert skip.reason == "skipped: batch 16 with adafactor OOM in trial 4"
        assert skip_reason(with_optim(8, optim), records, OPTIMIZERS) is None  # smaller
    # Another precision, or checkpointing, is another family.
    assert skip_reason(with_optim(16, "adamw_torch", "fp32"), records, OPTIMIZERS) is None


def test_an_oom_with_a_heavier_optimizer_says_nothing_of_the_lighter_ones() -> None:
    records = [rec(4, with_optim(16, "adamw_torch"), Outcome.OOM, peak_gib=5.0)]
    assert skip_reason(with_optim(16, "adafactor"), records, OPTIMIZERS) is None
    assert skip_reason(with_optim(16, "adamw_torch_fused"), records, OPTIMIZERS) is None
    fused = [rec(5, with_optim(16, "adamw_torch_fused"), Outcome.OOM, peak_gib=5.0)]
    assert skip_reason(with_optim(16, "adamw_torch"), fused, OPTIMIZERS) is not None
    assert skip_reason(with_optim(16, "adafactor"), fused, OPTIMIZERS) is None


def test_a_lighter_optimizer_out_of_memory_at_8_opens_the_heavier_ones_fallbacks() -> None:
    records = [rec(1, with_optim(8, "adafactor"), Outcome.OOM, peak_gib=5.0)]
    assert skip_reason(with_optim(4, "adamw_torch"), records, OPTIMIZERS) is None
    assert skip_reason(with_optim(4, "adafactor"), records, OPTIMIZERS) is None


def test_the_tests_dimensions_are_every_setting_of_a_candidate_and_every_lever() -> None:
    fields = {f.name for f in dataclasses.fields(Candidate)}
    assert set(DIMENSIONS) == fields - {
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
    }
    assert set(LEVERS) <= set(DIMENSIONS)


@pytest.mark.parametrize("name", sorted(DIMENSIONS))
def test_an_oom_skips_larger_batches_of_its_own_settings_only(name: str) -> None:
    """An out-of-memory with one attention kernel (say) says nothing of the others: a
    faster config would never be probed."""
    plain, other = DIMENSIONS[name]
    records = [rec(4, dataclasses.replace(cand(16), **{name: plain}), Outcome.OOM)]
    same = skip_reason(dataclasses.replace(cand(32), **{name: plain}), records, SPACE)
    assert same is not None and same.implies_oom
    across = skip_reason(dataclasses.replace(cand(32), **{name: other}), records, SPACE)
    if name in MEMORY_FREE:
        assert across is not None and across.implies_oom
    else:
        assert across is None, across


def test_a_precision_that_failed_alike_twice_and_never_ran_is_skipped() -> None:
    # fp16 on a QLoRA job's bf16 adapters fails every config alike (seen on an H100)
    unscale = "NotImplementedError: _amp_foreach_non_finite_check_and_unscale_cuda for 'BFloat16'"

    def failed(number: int, candidate: Candidate, reason: str = unscale) -> TrialRecord:
        record = rec(number, candidate, Outcome.ERROR)
        return dataclasses.replace(record, result=dataclasses.replace(record.result, reason=reason))

    once = [failed(4, cand(8, "bf16"))]
    assert skip_reason(cand(16, "bf16"), once, SPACE) is None  # one failure: maybe the config's
    twice = [*once, failed(5, cand(8, "bf16", ckpt=True))]
    skip = skip_reason(cand(16, "bf16"), twice, SPACE)
    assert skip is not None and not skip.implies_oom
    assert skip.reason.startswith(
        "skipped: bf16 failed alike in trials 4 and 5 (NotImplementedError"
    )
    assert skip_reason(cand(16, "fp32"), twice, SPACE) is None  # another precision
    other = [*once, failed(5, cand(8, "bf16", ckpt=True), "exit code -9; no result.json")]
    assert skip_reason(cand(16, "bf16"), other, SPACE) is None  # two different failures
    ran = [*twice, rec(6, cand(16, "bf16", ckpt=True))]
    assert skip_reason(cand(32, "bf16"), ran, SPACE) is None  # it runs somewhere: not the precision


def test_an_oom_with_more_checkpointing_rules_out_less_at_that_batch_and_above() -> None:
    """Memory is monotone along the levels (core/checkpointing.py): where every 2nd layer
    checkpointed ran out of memory, every 4th and none do too."""
    graded = dataclasses.replace(SPACE, checkpointing=("off", "every-4", "every-2", "on"))
    records = [rec(4, graded.candidate(16, "fp32", "every-2", "adamw_torch"), Outcome.OOM)]
    for level in ("off", "every-4"):
        for batch in (16, 32):
            skip = skip_reason(
                graded.candidate(batch, "fp32", level, "adamw_torch"), records, graded
            )
            assert skip is not None and skip.implies_oom
            assert skip.reason == "skipped: batch 16 ckpt/2 OOM in trial 4"
        assert (
            skip_reason(graded.candidate(8, "fp32", level, "adamw_torch"), records, graded) is None
        )
    # more checkpointing may fit where less did not
    assert skip_reason(graded.candidate(16, "fp32", "on", "adamw_torch"), records, graded) is None


def test_packed_rows_with_padding_free_set_too_are_the_packed_run_and_not_probed() -> None:
    """SFTTrainer flattens packed rows itself: packing with padding_free set as well is
    the same run as packing alone, a redundant proposal (not an infeasible point)."""
    packed = dataclasses.replace(cand(8), packing=True)
    both = dataclasses.replace(packed, padding_free=True)
    skip = skip_reason(both, [], SPACE)
    assert skip is not None and not skip.implies_oom
    assert skip.reason == "redundant: packing does what padding_free does already"
    assert skip_reason(packed, [], SPACE) is None
