"""Typed outcomes from evidence: the exception, the memory limit, the exit status.

Two small predicates. `is_out_of_memory` runs in the child on the exception that
stopped training; `classify_exit` runs in the parent on the exit status and the
child's result.json. Neither greps logs.
"""

from __future__ import annotations

import math
import signal

from autotune.core.trial import Outcome, TrialResult

# Messages allocators raise when an allocation fails. Each is only evidence of an OOM
# when a memory limit was in force (or memory in use was near it), see below.
_ALLOCATION_FAILURES = (
    "DefaultCPUAllocator: can't allocate memory",  # torch CPU allocator (malloc failed)
    "could not create a primitive",  # oneDNN under RLIMIT_DATA: scratchpad allocation
    "std::bad_alloc",  # C++ new in an extension or aten
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS workspace
    "CUDNN_STATUS_ALLOC_FAILED",  # cuDNN workspace (older cuDNN)
    "CUDNN_STATUS_INTERNAL_ERROR",  # cuDNN when its allocation fails at a tight limit
    "out of memory",  # CUDA runtime, bitsandbytes paged buffers
    "Cannot allocate memory",  # errno ENOMEM surfaced by any library
)
NEAR_LIMIT = 0.9  # memory in use at failure above this fraction of the limit is evidence


def is_out_of_memory(
    exc: BaseException, *, limit_bytes: int | None, in_use_bytes: int | None
) -> bool:
    """Whether the exception that stopped a trial was the memory budget running out."""
    if isinstance(exc, MemoryError):
        return True
    if (
        type(exc).__name__ == "OutOfMemoryError"
    ):  # torch.cuda.OutOfMemoryError / torch.OutOfMemoryError
        return True
    if limit_bytes is None:
        return False
    message = str(exc)
    if any(marker.lower() in message.lower() for marker in _ALLOCATION_FAILURES):
        return True
    return in_use_bytes is not None and in_use_bytes >= NEAR_LIMIT * limit_bytes


def loss_outcome(final_loss: float | None, skipped_steps: int) -> tuple[Outcome, str]:
    """A run that finished is unstable when its loss is not finite or the scaler skipped."""
    if final_loss is not None and not math.isfinite(final_loss):
        return Outcome.UNSTABLE, f"loss {final_loss} (not finite)"
    if skipped_steps:
        return Outcome.UNSTABLE, f"loss scaler skipped {skipped_steps} measured step(s)"
    return Outcome.OK, ""


def classify_exit(
    *,
    returncode: int | None,
    result: TrialResult | None,
    result_problem: str,
    timed_out: bool,
    limit_in_force: bool,
    timeout_s: float,
) -> TrialResult:
    """Combine the exit status with the child's result into the trial's final result."""
    if timed_out:
        reason = f"no result after {timeout_s:.0f}s; process group killed"
        return (result or TrialResult(Outcome.TIMEOUT)).replace(
            outcome=Outcome.TIMEOUT, reason=reason
        )
    if returncode is not None and returncode < 0:
        sig = -returncode
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if result is not None and result.outcome != Outcome.OK:
            # It classified its own failure, then died tearing down (seen: SIGSEGV at exit
            # after an OOM under RLIMIT_DATA). The typed result is the evidence.
            return result.replace(reason=f"{result.reason}; then killed by {name}")
        if sig == signal.SIGKILL and limit_in_force:
            return TrialResult(
                Outcome.OOM, reason="killed by SIGKILL under the memory limit (OOM killer)"
            )
        return TrialResult(Outcome.ERROR, reason=f"killed by {name}")
    if result is None:
        return TrialResult(
            Outcome.ERROR, reason=f"exit code {returncode}; {result_problem or 'no result.json'}"
        )
    if returncode != 0 and result.outcome == Outcome.OK:
        return result.replace(outcome=Outcome.ERROR, reason=f"exit code {returncode} after ok")
    return result
