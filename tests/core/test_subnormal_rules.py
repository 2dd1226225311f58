"""When subnormal numbers are worth the user's flushing: both measured, both at their bar."""

from __future__ import annotations

from autotune.core.subnormals import SHARE, SLOW, worth_flushing


def test_flushing_is_told_only_where_the_job_makes_them_and_the_cpu_pays() -> None:
    assert worth_flushing(SHARE, SLOW)
    assert not worth_flushing(SHARE / 2, 100 * SLOW)  # a CPU that pays, a job that makes few
    assert not worth_flushing(0.5, 1.0)  # a CPU that does not pay (or a GPU's speed)
    assert not worth_flushing(None, None) and not worth_flushing(0.5, None)  # not measured
