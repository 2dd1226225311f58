"""Training parity verdicts: the figures a user reads and the configs that are refused."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from helpers import SPEC, cand, rec

from autotune.core.enums import Objective, Outcome
from autotune.core.parity import (
    FLOOR,
    Arithmetic,
    Curve,
    changes,
    judge,
    judge_probes,
    needs_twin,
    tolerance,
)
from autotune.core.parity_state import ParityState
from autotune.core.parity_verdict import Parity, Status
from autotune.core.trial import TrialResult
from autotune.tuning.selection import select_best


def curve(*losses: float, skipped: int = 0) -> Curve:
    return Curve(tuple((3 * i, v) for i, v in enumerate(losses)), skipped, 3 * (len(losses) - 1))


REFERENCE = curve(6.0, 5.5, 5.2, 5.0, 4.9, 4.8, 4.75, 4.7)  # progress: 6.0 - 4.725


def test_a_split_twin_sets_the_tolerance_above_the_floor_only_when_rounding_is_large() -> None:
    quiet = curve(6.0, 5.5, 5.2, 5.0, 4.9, 4.8, 4.751, 4.701)
    assert tolerance(REFERENCE, quiet).fraction == FLOOR
    loud = curve(6.0, 5.5, 5.2, 5.0, 4.9, 4.8, 4.8, 4.75)  # 0.05 of 1.275 progress: 3.9%
    tol = tolerance(REFERENCE, loud)
    assert math.isclose(tol.fraction, 4 * 0.05 / 1.275, rel_tol=1e-6)
    assert "split twin's 3.92%" in tol.describe()
    assert tolerance(REFERENCE, None).rounding_gap is None


def test_a_slower_learner_is_diverged_with_its_figures() -> None:
    sgd = curve(6.0, 5.99, 5.98, 5.97, 5.96, 5.95, 5.94, 5.93)
    verdict = judge(REFERENCE, sgd, tolerance(REFERENCE, None))
    assert verdict.status == Status.DIVERGED and verdict.blocks_export
    assert verdict.figures() == (
        "diverged: loss 5.935 vs reference 4.725 (from 6) after 21 steps, +94.9% of its progress "
        "(tolerance 5.0%); learns slower than the reference"
    )
    assert math.isclose(verdict.ratio or 0, 5.935 / 4.725)


def test_a_curve_within_the_tolerance_passes_and_one_faster_beyond_it_does_not() -> None:
    tol = tolerance(REFERENCE, None)
    close = curve(6.0, 5.5, 5.2, 5.0, 4.9, 4.8, 4.76, 4.72)  # 2.7% of the progress
    assert judge(REFERENCE, close, tol).status == Status.OK
    faster = curve(6.0, 5.2, 4.8, 4.5, 4.3, 4.2, 4.1, 4.0)
    verdict = judge(REFERENCE, faster, tol)
    assert verdict.status == Status.DIVERGED and "learns faster" in verdict.reason


def test_nan_and_a_collapsing_loss_scale_are_diverged() -> None:
    tol = tolerance(REFERENCE, None)
    nan = curve(6.0, 5.5, 5.2, math.nan)
    verdict = judge(REFERENCE, nan, tol)
    assert (
        verdict.status == Status.DIVERGED and verdict.reason == "the loss became NaN/inf by step 9"
    )
    skipping = curve(6.0, 5.5, 5.2, 5.0, 4.9, 4.8, 4.75, 4.7, skipped=6)
    assert "loss scale collapsed (6 of 21 steps skipped)" in judge(REFERENCE, skipping, tol).reason
    calibrating = curve(6.0, 5.5, 5.2, 5.0, 4.9, 4.8, 4.75, 4.7, skipped=3)  # a few at the start
    assert judge(REFERENCE, calibrating, tol).status == Status.OK
    # A NaN is diverged on its own: not waved through when the reference gives no verdict.
    flat = curve(6.0, 5.99, 5.99, 5.98)
    assert judge(flat, nan, tolerance(flat, None)).status == Status.DIVERGED


def test_no_verdict_when_the_reference_itself_does_not_learn_or_fails() -> None:
    flat = curve(6.0, 5.99, 5.99, 5.98)
    verdict = judge(flat, curve(6.0, 5.0, 4.0, 3.0), tolerance(flat, None))
    assert verdict.status == Status.UNCHECKED and "raise --parity-steps" in verdict.reason
    failed = Curve.of(TrialResult(Outcome.OOM, reason="out of memory"), 30)
    assert judge(failed, REFERENCE, tolerance(failed, None)).status == Status.UNCHECKED
    # A finalist's run that did not finish says nothing about how it learns.
    verdict = judge(REFERENCE, failed, tolerance(REFERENCE, None))
    assert verdict.status == Status.UNCHECKED and not verdict.blocks_export
    assert "did not finish (out of memory)" in verdict.reason


def test_a_noisy_twin_never_widens_the_tolerance_past_a_quarter_of_the_progress() -> None:
    wild = curve(6.0, 5.5, 5.3, 5.2, 5.3, 5.4, 5.5, 5.6)
    assert tolerance(REFERENCE, wild).fraction == 0.25


def test_changes_split_into_what_keeps_and_what_alters_the_arithmetic() -> None:
    reference = cand(16)
    fused = reference.__class__(8, 8, "bf16", True, "adamw_torch_fused")
    found = {c.describe(): c.keeps_arithmetic for c in changes(reference, fused)}
    assert found == {
        "batch split 16x4 -> 8x8": True,
        "checkpointing off -> on": True,
        "precision fp32 -> bf16": False,
        "optimizer adamw_torch -> adamw_torch_fused": True,  # the same update, fused
    }


def test_a_diverged_config_is_never_selected_and_the_state_survives_the_study() -> None:
    state = ParityState(
        cand(16),
        30,
        1e-3,
        0,
        {"reference": REFERENCE},
        {"bf16|adamw_torch": Parity(Status.DIVERGED, "learns slower")},
    )
    state = ParityState.from_json(state.to_json())
    fast = rec(1, cand(16, "bf16"), sps=30.0)
    plain = rec(2, cand(8), sps=10.0)
    records = [
        r.__class__(r.number, r.candidate, r.result, 1, state.verdict(r.candidate))
        for r in (fast, plain)
    ]
    assert records[0].parity is not None and records[0].parity.status == Status.DIVERGED
    assert records[1].parity is not None and records[1].parity.status == Status.SAME
    best = select_best(records, fit_limit_bytes=SPEC.fit_limit_bytes)
    assert best is not None and best.number == 2
    assert state.curves["reference"] == REFERENCE


def test_a_rerun_retries_what_did_not_finish_and_other_settings_start_over() -> None:
    failed = Curve((), 0, 30, "out of memory")
    state = ParityState(
        cand(16),
        30,
        1e-3,
        0,
        {"reference": failed, "twin": REFERENCE},
        {
            "bf16|adamw_torch": Parity(Status.UNCHECKED, "no reference"),
            "fp32|sgd": Parity(Status.DIVERGED, "slower"),
        },
    )
    retry = state.retrying()
    assert retry.curves == {} and list(retry.verdicts) == ["fp32|sgd"]
    assert state.same_setup(ParityState(cand(8), 30, 1e-3, 0))  # another split: same arithmetic
    assert not state.same_setup(ParityState(cand(16), 30, 1e-3, 1))  # another seed
    assert not state.same_setup(ParityState(cand(16), 20, 1e-3, 0))  # other --parity-steps


def test_the_twin_runs_only_when_it_could_change_the_verdict() -> None:
    floor = tolerance(REFERENCE, None)
    inside = judge(REFERENCE, curve(6.0, 5.5, 5.2, 5.0, 4.9, 4.8, 4.76, 4.72), floor)
    close_call = curve(6.0, 5.5, 5.2, 5.0, 4.9, 4.8, 4.82, 4.8)  # 7.8% of the progress
    between = judge(REFERENCE, close_call, floor)
    beyond = judge(REFERENCE, curve(6.0, 5.99, 5.98, 5.97, 5.96, 5.95, 5.94, 5.93), floor)
    assert not needs_twin(inside) and inside.status == Status.OK
    assert needs_twin(between) and between.status == Status.DIVERGED  # until calibrated
    assert not needs_twin(beyond)
    loud = curve(6.0, 5.5, 5.2, 5.0, 4.9, 4.8, 4.8, 4.75)  # the twin: 3.9% of the progress
    assert judge(REFERENCE, close_call, tolerance(REFERENCE, loud)).status == Status.OK


def test_zero_in_16_bits_is_its_own_arithmetic_and_in_fp32_the_same_as_ddp() -> None:
    reference = cand(16)
    fp32_zero = dataclasses.replace(reference, zero_stage=3)
    assert Arithmetic.of(fp32_zero) == Arithmetic.of(reference)  # DDP's sums, sharded
    assert {c.describe(): c.keeps_arithmetic for c in changes(reference, fp32_zero)} == {
        "zero_stage default -> 3": True
    }
    bf16 = dataclasses.replace(reference, precision="bf16")
    bf16_zero = dataclasses.replace(bf16, zero_stage=2)
    assert Arithmetic.of(bf16_zero).key == "bf16|adamw_torch|deepspeed" != Arithmetic.of(bf16).key
    assert {c.describe(): c.keeps_arithmetic for c in changes(bf16, bf16_zero)} == {
        "zero_stage default -> 2": False  # DeepSpeed's 16-bit weights, fp32 master copies
    }


def short(*losses: float) -> Curve:
    """A run of one optimizer step between held-out evaluations."""
    return Curve(tuple(enumerate(losses)), 0, len(losses) - 1)


def test_a_run_too_short_to_tell_is_unverified_never_ok() -> None:
    """mt5-small's Adafactor sat +1.1% from AdamW after 4 steps and +15% after 20: within
    the floor's calibration (20 steps) a short run cannot call it the same training."""
    reference = short(6.0, 5.0, 4.6, 4.4)
    tol = tolerance(reference, None)
    verdict = judge(reference, short(6.0, 5.0, 4.61, 4.41), tol)
    assert verdict.status == Status.UNVERIFIED and verdict.blocks_export
    assert "3 steps cannot separate a 5% gap from rounding noise; 20 can" in verdict.figures()
    # a gross divergence is caught all the same
    assert judge(reference, short(6.0, 5.9, 5.8, 5.7), tol).status == Status.DIVERGED
    # --parity quick: exported, and saying so
    adafactor = dataclasses.replace(cand(16), optim="adafactor")
    key = Arithmetic.of(adafactor).key
    state = ParityState(cand(16), 3, 1e-3, verdicts={key: verdict})
    assert state.verdict(adafactor).blocks_export  # type: ignore[union-attr]
    quick = ParityState.from_json(dataclasses.replace(state, quick=True).to_json())
    allowed = quick.verdict(adafactor)
    assert allowed is not None and allowed.status == Status.UNVERIFIED
    assert not allowed.blocks_export and "exported unverified" in allowed.figures()


def test_a_twin_noisier_than_any_tolerance_leaves_a_close_run_unverified() -> None:
    twin = curve(6.0, 5.5, 5.2, 5.0, 4.9, 4.8, 4.85, 4.8)  # 7.8% of the progress: 4x is 31%
    tol = tolerance(REFERENCE, twin)
    close = curve(6.0, 5.5, 5.2, 5.0, 4.9, 4.8, 4.76, 4.72)
    verdict = judge(REFERENCE, close, tol)
    assert verdict.status == Status.UNVERIFIED and "rounding alone" in verdict.reason


PROBE = (6.14, 5.98, 5.85, 5.74, 5.62, 5.50, 5.41, 5.33)  # a probe's training losses


def test_a_probe_of_the_same_arithmetic_passes_unverified_and_an_optimizer_change_is_seen() -> None:
    """Probes pair step by step (the same batches from the same weights): another batch
    split's rounding passes, never as ok (a probe is too short to verify); SGD's losses,
    barely falling, are diverged; a NaN is diverged; two losses read nothing."""
    split = tuple(v + 0.001 for v in PROBE)
    alike, tol = judge_probes(PROBE, split, split)
    assert alike.status == Status.UNVERIFIED and alike.evidence == "probes"
    assert "a probe's 8 training steps cannot verify" in alike.reason
    assert "8 probe steps" in alike.figures()
    assert tol is not None and tol.rounding_gap is not None
    sgd = (6.14, 6.15, 6.15, 6.12, 6.10, 6.09)
    slow, _ = judge_probes(PROBE, sgd)
    assert slow.status == Status.DIVERGED and slow.steps == 6  # the steps both trained
    assert "learns slower" in slow.reason
    nan, _ = judge_probes(PROBE, (6.14, 5.9, math.nan))
    assert nan.status == Status.DIVERGED
    short, _ = judge_probes(PROBE, (6.14, 5.9))
    assert short.status == Status.UNCHECKED and "a verdict reads at least 3" in short.reason


def test_probes_whose_losses_the_trainer_scales_by_their_accumulation_pair_from_their_start() -> (
    None
):
    """mT5 takes the Trainer's item count and ignores it, so at 8x2 every step's loss
    reads twice the 16x1's (seen in the README's main job: bf16 at 16x1 judged against
    the fp32 reference at 8x2 read as diverged, -49% of its progress). From the same
    weights on the same first batch the first losses must agree: curves are compared
    from there, so the split passes and a real change of learning is still seen."""
    doubled = tuple(2 * v for v in PROBE)  # the reference at 8x2, the run at 16x1
    alike, _ = judge_probes(doubled, PROBE, doubled)
    assert alike.status == Status.UNVERIFIED, alike.figures()
    assert alike.reference_final_loss is not None and alike.final_loss is not None
    assert abs(alike.final_loss / alike.reference_final_loss - 1) < 0.01  # on one scale
    faster = (6.14, 5.5, 5.0, 4.6, 4.3, 4.1, 3.9, 3.8)  # twice the progress of PROBE
    seen, _ = judge_probes(doubled, faster, doubled)
    assert seen.status == Status.DIVERGED and "learns faster" in seen.reason


def test_probe_parity_takes_the_recipes_probe_as_reference_and_its_other_split_as_twin() -> None:
    """The study's records alone decide: the recipe's arithmetic at another split
    calibrates, each other arithmetic's longest probe is judged; no run is needed."""
    from autotune.tuning.parity import probe_state

    def probe(number: int, candidate: Any, losses: tuple[float, ...]) -> Any:
        r = rec(number, candidate)
        return dataclasses.replace(r, result=r.result.replace(step_losses=losses))

    records = [
        probe(0, cand(32), PROBE),
        probe(1, cand(64), tuple(v + 0.002 for v in PROBE)),
        probe(2, cand(64, "bf16"), tuple(v + 0.004 for v in PROBE)),
        probe(3, dataclasses.replace(cand(64), optim="sgd"), (6.14, 6.15, 6.15, 6.12)),
    ]
    state = probe_state(SPEC, records)
    # no recipe given: fp32 AdamW at the largest micro-batch that fits; 32 its twin
    assert state.steps == 0 and state.reference == cand(64)
    assert state.curves["twin"].points[0] == (1, PROBE[0])
    assert state.verdicts[Arithmetic.of(cand(64, "bf16")).key].status == Status.UNVERIFIED
    sgd = Arithmetic.of(records[3].candidate).key
    assert state.verdicts[sgd].status == Status.DIVERGED
    assert {"reference", "twin"} <= set(state.curves)
    assert state.verdict(cand(64)) == Parity(Status.SAME)


def test_a_packed_probe_is_paired_with_no_other_and_its_verdict_is_unchecked() -> None:
    """Packed rows train other batches than the recipe's probe: even with losses that
    track the reference's step by step, no verdict is read from them, and no parity
    run is owed either (its steps train more samples than the reference's)."""
    from autotune.core.parity import UNPAIRED
    from autotune.tuning.parity import probe_state, unjudged

    def probe(number: int, candidate: Any, losses: tuple[float, ...]) -> Any:
        r = rec(number, candidate)
        return dataclasses.replace(r, result=r.result.replace(step_losses=losses))

    packed = dataclasses.replace(cand(64), packing=True)
    records = [probe(0, cand(64), PROBE), probe(1, packed, PROBE)]
    state = probe_state(SPEC, records)
    assert Arithmetic.of(packed).key not in state.verdicts
    assert state.verdict(packed) == UNPAIRED and UNPAIRED.status == Status.UNCHECKED
    assert not UNPAIRED.blocks_export
    runs = ParityState(cand(64), 20, 1e-3)
    assert packed not in unjudged(SPEC, runs, records, 3, Objective.THROUGHPUT)
