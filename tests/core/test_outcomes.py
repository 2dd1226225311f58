from __future__ import annotations

import signal

import pytest

from autotune.core.outcomes import classify_exit, is_out_of_memory, loss_outcome
from autotune.core.trial import Outcome, TrialResult

GIB = 2**30


class OutOfMemoryError(RuntimeError):
    """Same name as torch.OutOfMemoryError (what CUDA raises)."""


@pytest.mark.parametrize(
    "exc",
    [
        MemoryError(),
        OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory"
        ),
        RuntimeError("could not create a primitive"),
        RuntimeError("std::bad_alloc"),
    ],
)
def test_allocation_failures_under_a_limit_are_oom(exc: BaseException) -> None:
    assert is_out_of_memory(exc, limit_bytes=GIB, in_use_bytes=GIB // 4)


@pytest.mark.parametrize(
    "exc",
    [
        OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"),
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        RuntimeError("CUDA error: out of memory"),
    ],
)
def test_typed_cuda_allocation_failures_are_oom(exc: BaseException) -> None:
    assert is_out_of_memory(exc, limit_bytes=GIB, in_use_bytes=GIB // 4, device_kind="cuda")


def test_on_cuda_an_error_near_the_cap_is_not_taken_for_an_oom() -> None:
    """The caching allocator keeps reserved memory near its cap: a tf32, bitsandbytes or
    NCCL error there is that error, not an OOM that would skip every larger batch."""
    for exc in (
        RuntimeError("NCCL error: unhandled system error"),
        RuntimeError("CUDNN_STATUS_INTERNAL_ERROR"),
        RuntimeError("mix of the legacy and new APIs"),
    ):
        assert not is_out_of_memory(
            exc, limit_bytes=GIB, in_use_bytes=int(0.99 * GIB), device_kind="cuda"
        )
    # On the CPU the same evidence (the data segment at the limit) does mean an OOM.
    assert is_out_of_memory(
        RuntimeError("some kernel failed"), limit_bytes=GIB, in_use_bytes=int(0.99 * GIB)
    )


def test_allocator_message_without_a_limit_is_not_oom() -> None:
    exc = RuntimeError("could not create a primitive")
    assert not is_out_of_memory(exc, limit_bytes=None, in_use_bytes=None)


def test_unknown_error_near_the_limit_is_oom_by_evidence() -> None:
    exc = RuntimeError("some kernel failed")
    assert is_out_of_memory(exc, limit_bytes=GIB, in_use_bytes=int(0.95 * GIB))
    assert not is_out_of_memory(exc, limit_bytes=GIB, in_use_bytes=GIB // 2)


def test_ordinary_errors_are_not_oom() -> None:
    assert not is_out_of_memory(ValueError("bad shape"), limit_bytes=GIB, in_use_bytes=0)


def test_nan_loss_and_skipped_steps_are_unstable() -> None:
    assert loss_outcome(float("nan"), 0)[0] == Outcome.UNSTABLE
    assert loss_outcome(float("inf"), 0)[0] == Outcome.UNSTABLE
    assert loss_outcome(2.3, 1)[0] == Outcome.UNSTABLE
    assert loss_outcome(2.3, 0) == (Outcome.OK, "")


def _exit(**kw: object) -> TrialResult:
    args = {
        "returncode": 0,
        "result": None,
        "result_problem": "",
        "timed_out": False,
        "limit_in_force": True,
        "timeout_s": 10.0,
    }
    args.update(kw)
    return classify_exit(**args)  # type: ignore[arg-type]


def test_sigkill_under_a_limit_is_oom_else_error() -> None:
    assert _exit(returncode=-signal.SIGKILL).outcome == Outcome.OOM
    killed = _exit(returncode=-signal.SIGKILL, limit_in_force=False)
    assert killed.outcome == Outcome.ERROR and "SIGKILL" in killed.reason


def test_timeout_wins_over_everything() -> None:
    result = _exit(returncode=-signal.SIGKILL, timed_out=True)
    assert result.outcome == Outcome.TIMEOUT and result.reason.startswith("timeout after 10 s")


def test_no_or_bad_result_is_error() -> None:
    result = _exit(returncode=1, result_problem="malformed result.json (JSONDecodeError)")
    assert result.outcome == Outcome.ERROR and "malformed" in result.reason
    assert _exit(returncode=0).outcome == Outcome.ERROR


def test_child_result_is_kept_when_exit_is_clean() -> None:
    oom = TrialResult(Outcome.OOM, reason="out of memory", peak_memory_bytes=GIB)
    assert _exit(result=oom) == oom
    ok = TrialResult(Outcome.OK, samples_per_s=3.0)
    assert _exit(result=ok, returncode=3).outcome == Outcome.ERROR


def test_result_round_trips_through_json() -> None:
    result = TrialResult(
        Outcome.OK, samples_per_s=1.5, step_times_s=(0.1, 0.2), phases_s={"a": 1.0}
    )
    assert TrialResult.from_json(result.to_json()) == result


def test_a_typed_failure_survives_a_crash_at_exit() -> None:
    oom = TrialResult(Outcome.OOM, reason="out of memory")
    result = _exit(returncode=-signal.SIGSEGV, result=oom)
    assert result.outcome == Outcome.OOM and "SIGSEGV" in result.reason
    ok = TrialResult(Outcome.OK, samples_per_s=3.0)
    assert _exit(returncode=-signal.SIGSEGV, result=ok).outcome == Outcome.ERROR
