"""Typed outcomes from evidence: the exception, the memory limit, the exit status.

Two small predicates. `is_out_of_memory` runs in the child on the exception that
stopped training; `classify_exit` runs in the parent on the exit status and the
child's result.json. Neither greps logs: `failure_line` reads a child's stderr only to
say in words why one that wrote no result failed.
"""

from __future__ import annotations

import math
import re
import signal

from autotune.core.enums import DeviceKind, Outcome
from autotune.core.trial import TrialResult

# Messages allocators raise when an allocation fails, per device kind. Each is evidence
# of an OOM only when a memory limit was in force.
_CPU_FAILURES = (
    "DefaultCPUAllocator: can't allocate memory",  # torch CPU allocator (malloc failed)
    "could not create a primitive",  # oneDNN under RLIMIT_DATA: scratchpad allocation
    "std::bad_alloc",  # C++ new in an extension or aten
    "Cannot allocate memory",  # errno ENOMEM surfaced by any library
    "out of memory",  # bitsandbytes' paged buffers and others
)
_CUDA_FAILURES = (
    "CUDA out of memory",  # the caching allocator (also raised typed, see below)
    "CUDA error: out of memory",  # cudaErrorMemoryAllocation outside the allocator
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS workspace
    "CUDNN_STATUS_ALLOC_FAILED",  # cuDNN workspace
    "std::bad_alloc",  # host-side C++ new
)
NEAR_LIMIT = 0.9  # CPU: data segment at failure above this fraction of the limit


def is_out_of_memory(
    exc: BaseException,
    *,
    limit_bytes: int | None,
    in_use_bytes: int | None,
    device_kind: str = DeviceKind.CPU,
) -> bool:
    """Whether the exception that stopped a trial was the memory budget running out.

    CUDA raises typed errors for allocation failures, so only those count there: its
    caching allocator keeps reserved memory near the cap, and "memory near the limit"
    would turn any error (a tf32, bitsandbytes or NCCL one) into an OOM that skips every
    larger batch. On the CPU, where an allocation failure can surface as any error from a
    library that did not check malloc, memory near the limit is evidence too."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True  # MemoryError; torch.OutOfMemoryError / torch.cuda.OutOfMemoryError
    if limit_bytes is None:
        return False
    message = str(exc).lower()
    if device_kind == DeviceKind.CUDA:
        return any(marker.lower() in message for marker in _CUDA_FAILURES)
    if any(marker.lower() in message for marker in _CPU_FAILURES):
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
        reason = f"timeout after {timeout_s:.0f} s with no result: its process group was killed"
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


_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?::.*)?$")
_ROOT_CAUSE = re.compile(
    r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*-\d+[^\n]*\((SIG\w+)\)", re.S
)


def failure_line(stderr: str) -> str:
    """What a child that wrote no result printed as its failure: a DDP rank killed by a
    signal (torchrun's root cause), else the last exception line ('' for none)."""
    if match := _ROOT_CAUSE.search(stderr):
        return f"rank {match[1]} killed by {match[2]}"
    for line in reversed(stderr.splitlines()):
        match = _EXCEPTION.match(line.strip())
        if match and not match[1].endswith("ChildFailedError"):  # torchrun's own summary
            return line.strip()[:200]
    return ""
