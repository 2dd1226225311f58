"""A parity run in a real child: the same start for every config, a loss that falls, and a
held-out figure that does not scale with the accumulation steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY_T5

from autotune.core.enums import Outcome, Task
from autotune.core.parity import CALIBRATED_STEPS, Curve, judge, tolerance
from autotune.core.trial import Candidate, ModelSpec, TrialConfig
from autotune.hf.training_args import checkpointing_field, tuned_arguments
from autotune.launch.runner import run_trial


def parity(
    tmp_path: Path, name: str, candidate: Candidate, lr: float = 1e-3, steps: int = 12
) -> Curve:
    args = tuned_arguments(candidate, device_kind="cpu", checkpointing_field=checkpointing_field())
    config = TrialConfig(
        number=-1,
        trial_dir=str(tmp_path / name),
        candidate=candidate,
        device="cpu",
        model=ModelSpec("tiny-t5", "local", Task.SEQ2SEQ, TINY_T5),
        seq_len=32,
        target_len=8,
        memory_limit_bytes=None,
        training_arguments={**args, "learning_rate": lr},
        parity_steps=steps,
    )
    result = run_trial(config, timeout_s=300)
    assert result.outcome in (Outcome.OK, Outcome.UNSTABLE), result.error
    return Curve.of(result, steps)


@pytest.mark.slow
def test_a_split_twin_starts_where_the_reference_does_and_learns_the_same(
    tmp_path: Path,
) -> None:
    reference = parity(tmp_path, "ref", Candidate(8, 1, "fp32", False, "adamw_torch"))
    twin = parity(tmp_path, "twin", Candidate(2, 4, "fp32", True, "adamw_torch"))
    assert [s for s, _ in reference.points] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert reference.start == pytest.approx(twin.start, rel=1e-6)  # same weights, same batches
    assert reference.end < 0.95 * reference.start  # learnable: enough progress for a verdict
    # Four micro-batches instead of one (other sums, other dropout masks): the same curve
    # within the widest tolerance.
    gap = judge(reference, twin, tolerance(reference, None)).gap
    assert gap is not None and abs(gap) < 0.25


@pytest.mark.slow
def test_a_fused_optimizer_passes_and_a_run_driven_to_nan_is_diverged(tmp_path: Path) -> None:
    # as long as a verdict must be to say "ok" (core/parity.CALIBRATED_STEPS)
    steps = CALIBRATED_STEPS
    reference = parity(tmp_path, "ref", Candidate(8, 1, "fp32", False, "adamw_torch"), steps=steps)
    tol = tolerance(reference, None)
    fused = Candidate(8, 1, "fp32", False, "adamw_torch_fused")
    assert judge(reference, parity(tmp_path, "fused", fused, steps=steps), tol).status == "ok"
    exploding = parity(tmp_path, "nan", Candidate(8, 1, "fp32", False, "sgd"), lr=1e12)
    assert not exploding.finite
    assert exploding.points[-1][0] < 12  # the run stops at the first non-finite loss
    verdict = judge(reference, exploding, tol)
    assert verdict.status == "diverged" and "NaN/inf" in verdict.reason
