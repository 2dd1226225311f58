"""What a trial's result shows of itself: figures within their physical range."""

from __future__ import annotations

from autotune.core.trial import Outcome, TrialResult


def test_an_mfu_above_100_percent_is_never_shown_and_says_why() -> None:
    """A CPU fp16 trial of the main job: its peak measured at 4.1 GFLOP/s with a kernel
    training did not use, where training ran 70 GFLOP/s of model FLOPs."""
    beaten = TrialResult(Outcome.OK, model_flops_per_s=70e9, peak_flops_per_s=4.1e9)
    assert beaten.mfu is None
    assert beaten.mfu_unknown.startswith("training ran 70 GFLOP/s of model FLOPs, above the")
    fair = TrialResult(Outcome.OK, model_flops_per_s=12e9, peak_flops_per_s=48e9)
    assert fair.mfu == 0.25 and fair.mfu_unknown == ""
    assert TrialResult(Outcome.OK).mfu is None and TrialResult(Outcome.OK).mfu_unknown == ""
