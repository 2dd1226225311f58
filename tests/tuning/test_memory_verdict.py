"""The estimate fitted to a study's probes, and the verdicts the search takes from it."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import GIB, SPEC, cand, rec

from autotune.core.trial import Outcome, TrialRecord, TrialResult
from autotune.tuning._memory_verdict import (
    OOM_SLACK,
    activation_scale,
    far_over_budget,
    process_bytes,
)
from autotune.tuning.estimate import PROCESS_BYTES, Breakdown


def test_activation_scale_is_the_most_optimistic_fit() -> None:
    b = Breakdown(weights=GIB, gradients=GIB, optimizer_state=0, activations=GIB)
    runs = [
        (b, TrialResult(Outcome.OK, peak_memory_bytes=4 * GIB)),  # 2 GiB of activations
        (b, TrialResult(Outcome.OK, peak_memory_bytes=3 * GIB)),  # 1 GiB
        (b, TrialResult(Outcome.OOM, peak_memory_bytes=9 * GIB)),  # not a clean run
    ]
    assert activation_scale(runs, process_bytes=0) == 1.0
    assert activation_scale([], process_bytes=0) is None
    # a peak the optimizer step may have set (1 GiB of its temporaries, 1 GiB above the
    # static terms) says nothing of the activations: left out, not read as a scale of 1
    stepped = Breakdown(
        weights=GIB, gradients=GIB, optimizer_state=0, activations=GIB // 8, step=GIB
    )
    assert (
        activation_scale(
            [(stepped, TrialResult(Outcome.OK, peak_memory_bytes=3 * GIB))], process_bytes=0
        )
        is None
    )


def with_baseline(number: int, baseline: dict[str, int]) -> TrialRecord:
    record = rec(number, cand(8))
    return dataclasses.replace(record, result=record.result.replace(baseline=baseline))


def test_the_process_term_is_what_the_probes_measured_before_training() -> None:
    """On an H100 the context was 676 MiB where the typical figure says 600."""
    mib = 2**20
    cuda = [
        with_baseline(0, {"context_bytes": 676 * mib}),
        with_baseline(1, {}),
        with_baseline(2, {"context_bytes": 680 * mib}),
        with_baseline(3, {"context_bytes": 670 * mib}),
    ]
    assert process_bytes("cuda", cuda) == 676 * mib
    assert process_bytes("cuda", []) == PROCESS_BYTES["cuda"]
    cpu = [with_baseline(0, {"rss_bytes": 420 * mib, "vmdata_bytes": 1300 * mib})]
    assert process_bytes("cpu", cpu) == 420 * mib  # the peak counts the resident set


def test_the_process_term_holds_what_the_jobs_setup_held_before_its_first_step() -> None:
    """The Trainer and its data (a user's dataset, tokenizer) are held before the first
    step by every config alike: without them the fit read 6.3x the analytic activations
    at batch 1 and 2.6x at batch 8, and was optimistic for every smaller config."""
    mib = 2**20
    probes = [
        with_baseline(0, {"rss_bytes": 480 * mib, "setup_bytes": 28 * mib}),
        with_baseline(1, {"rss_bytes": 482 * mib, "setup_bytes": 30 * mib}),
        with_baseline(2, {"rss_bytes": 481 * mib}),  # an OOM before its Trainer was built
    ]
    assert process_bytes("cpu", probes) == 481 * mib + 30 * mib
    # a setup measured before any process term: still counted, on the typical figure
    setup_only = [with_baseline(3, {"setup_bytes": mib})]
    assert process_bytes("cpu", setup_only) == PROCESS_BYTES["cpu"] + mib


def test_before_a_clean_run_an_oom_bounds_the_activations_from_below() -> None:
    """The smallest scale that puts the OOM run over the limit: optimistic, but enough to
    say that a config with twice its activations cannot fit either."""
    b = Breakdown(weights=GIB, gradients=GIB, optimizer_state=0, activations=GIB)
    oom = (b, TrialResult(Outcome.OOM, error="RuntimeError: DefaultCPUAllocator: can't allocate"))
    limit = int(4 * GIB / OOM_SLACK)  # room for 2 GiB of activations above the statics
    assert activation_scale([oom], process_bytes=0, limit_bytes=limit) == pytest.approx(2.0)
    assert activation_scale([oom], process_bytes=0) is None  # no limit, no bound
    # the peak the OOM run recorded, where it says more than the slack: it held that much
    held = (b, TrialResult(Outcome.OOM, peak_memory_bytes=int(4.5 * GIB)))
    assert activation_scale([held], process_bytes=0, limit_bytes=limit) == pytest.approx(2.5)
    low = (b, TrialResult(Outcome.OOM, peak_memory_bytes=3 * GIB))
    assert activation_scale([low], process_bytes=0, limit_bytes=limit) == pytest.approx(2.0)
    # a SIGKILL from outside (the host's OOM killer): no error, no peak, no bound
    killed = (b, TrialResult(Outcome.OOM, reason="killed by SIGKILL under the memory limit"))
    assert activation_scale([killed], process_bytes=0, limit_bytes=limit) is None
    # a clean run's ratio outranks any bound: it measured the activations
    clean = (b, TrialResult(Outcome.OK, peak_memory_bytes=int(2.5 * GIB)))
    assert activation_scale([oom, clean], process_bytes=0, limit_bytes=limit) == 0.5
    # an OOM its static terms and the optimizer step already explain bounds nothing
    stepped = Breakdown(
        weights=GIB, gradients=GIB, optimizer_state=0, activations=GIB, step=3 * GIB
    )
    assert activation_scale([(stepped, oom[1])], process_bytes=0, limit_bytes=limit) is None


def test_after_the_first_guess_runs_out_of_memory_a_bigger_one_is_judged_not_to_fit() -> None:
    """Under a budget that binds, the default (8x2 fp32) ran out of memory: the estimate
    now says 16x1 fp32, with twice its activations, cannot fit, and still lets bf16 at 8
    (half the activations) and checkpointing be tried."""
    spec = dataclasses.replace(SPEC, parameters=10_000_000)
    base = far_over_budget(spec, [])
    assert base.fits(cand(16)) and base.fits(cand(8))  # nothing measured: all may fit
    records = [rec(0, cand(8), Outcome.OOM)]
    verdicts = far_over_budget(spec, records)
    assert not verdicts.fits(cand(16))
    assert verdicts.fits(cand(8, ckpt=True))
    predict = far_over_budget(spec, records).predict
    assert predict(cand(8, "bf16")) < predict(cand(8))  # type: ignore[operator]


def test_an_oom_bound_reorders_proposals_but_never_skips_a_config_for_good() -> None:
    """An OOM at bf16 with checkpointing (small modelled activations) implies a large
    scale for every family; a skip is never revisited, so it rests on clean runs only."""
    spec = dataclasses.replace(SPEC, parameters=10_000_000)
    records = [rec(0, cand(8, "bf16", ckpt=True), Outcome.OOM)]
    predict = far_over_budget(spec, records).predict
    assert predict(cand(8)) > 1.5 * spec.memory_budget_bytes  # type: ignore[operator]
    verdicts = far_over_budget(spec, records)
    assert not verdicts.fits(cand(8))  # proposed after what may fit
    assert verdicts(cand(8)) is None  # but not skipped


def test_a_config_the_estimate_ranks_with_an_out_of_memory_one_is_expected_to_run_out() -> None:
    """The families' LoRA job at 791 MiB: batch 8 bf16 with fused AdamW ran out of memory,
    and the same with Adafactor (the same activations, a few KiB less state) was still
    said to fit, and probed out of memory. An OOM says the config needed more than the
    limit, by how much it cannot say: a config the estimate puts within OOM_NEAR of it is
    proposed after those that may fit; one well below it, and a clean run, still fit."""
    from autotune.tuning._memory_verdict import OOM_NEAR

    space = dataclasses.replace(SPEC.space, optimizers=("adamw_torch", "adafactor"))
    spec = dataclasses.replace(SPEC, space=space, parameters=10_000_000)
    adamw, adafactor = (space.candidate(8, "fp32", False, o) for o in space.optimizers)
    clean = rec(1, space.candidate(1, "fp32", False, "adamw_torch"), peak_gib=1.0)
    for records in ([rec(0, adamw, Outcome.OOM)], [rec(0, adamw, Outcome.OOM), clean]):
        verdicts = far_over_budget(spec, records)
        near = verdicts.predict(adamw)
        assert near is not None
        lighter = verdicts.predict(adafactor)
        assert lighter is not None and lighter > near - OOM_NEAR * spec.fit_limit_bytes
        assert lighter <= spec.fit_limit_bytes  # by its own size, it would fit
        assert not verdicts.fits(adafactor)
        assert verdicts(adafactor) is None  # never skipped for it: only proposed later
        assert verdicts.fits(space.candidate(8, "fp32", True, "adafactor"))
        assert verdicts.fits(space.candidate(2, "fp32", False, "adafactor"))
    # before any OOM, the same estimate says it fits
    assert far_over_budget(spec, [clean]).fits(adafactor)


def test_an_oom_the_probes_rank_otherwise_says_nothing_of_its_neighbours() -> None:
    """An OOM estimated under a config that ran within the limit (something the estimate
    leaves out set it off) contradicts the estimate's ranking: configs near it by the
    estimate are not put after the others for it."""
    space = dataclasses.replace(SPEC.space, optimizers=("adamw_torch", "adafactor"))
    spec = dataclasses.replace(SPEC, space=space, parameters=10_000_000)
    small = space.candidate(2, "fp32", False, "adamw_torch")
    twin = space.candidate(2, "fp32", False, "adafactor")
    bigger = space.candidate(4, "fp32", False, "adamw_torch")
    oom = rec(0, small, Outcome.OOM)
    assert not far_over_budget(spec, [oom]).fits(twin)
    fit = rec(1, bigger, peak_gib=2.0)
    verdicts = far_over_budget(spec, [oom, fit])
    assert verdicts.predict(bigger) > verdicts.predict(small)  # type: ignore[operator]
    assert verdicts.fits(twin)
