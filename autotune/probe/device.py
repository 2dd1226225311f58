"""The probe's side of the device seam: what a probe does that differs between the CPU
and CUDA: `enforce_memory_limit`, `synchronize`, `memory_in_use`, `peak_memory_bytes`,
the baseline it starts from and what it records of its environment. Detecting the
device, and the rules the parent applies to a probe, are `autotune.system.devices`.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.core.device import measuring_environment
from autotune.core.enums import DeviceKind
from autotune.probe import _cuda_context as context
from autotune.probe import fork_pages
from autotune.system.devices import cpu_name

# Deferred imports: torch loads in the probe, once `prepare_environment` has chosen its GPU; the
# search imports this module (through the fork server) without it

# ---- child side -------------------------------------------------------------------------


def enforce_memory_limit(device_kind: str, index: int, limit_bytes: int) -> None:
    """Make an over-budget config fail with the allocator's own out-of-memory error.
    Called once the imports are done (`limit_data_segment`).

    CPU: RLIMIT_DATA caps the process's data segment, so malloc (and torch's
    DefaultCPUAllocator) fails at the limit. CUDA: the context is created and measured
    first (the allocator does not see it), then the caching allocator is capped at the
    limit less the context."""
    if device_kind == DeviceKind.CPU:
        limit_data_segment(limit_bytes)
        return
    import torch

    context = cuda_context(index)
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = max(0.0, min(1.0, (limit_bytes - context) / total))
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    _CUDA["cap_bytes"] = int(fraction * total)


def limit_in_force(device_kind: str) -> int | None:
    """The memory limit this process runs under, read back from where it is enforced
    (CPU: RLIMIT_DATA; CUDA: the allocator's cap plus the context it leaves out); None
    when none is set. A result records it, so a test can join the limit the search
    computed to the one the probe really ran under."""
    if device_kind == DeviceKind.CUDA:
        if "cap_bytes" not in _CUDA:
            return None
        return int(_CUDA["cap_bytes"]) + int(_CUDA["context_bytes"])
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def limit_data_segment(limit_bytes: int) -> None:
    """RLIMIT_DATA at the limit, set after the imports: what they hold is checked against
    it instead (MemoryError when over, as the process would have failed under it). An
    allocation failing inside an import does not raise: scipy's OpenBLAS (which
    transformers imports) spins for ever in blas_memory_alloc, and a C extension failing
    to load can kill the process before it reports."""
    held = memory_in_use(DeviceKind.CPU)
    if held > limit_bytes:
        raise MemoryError(
            f"after its imports the process holds {held / 2**20:.0f} MiB of data segment, "
            f"over the {limit_bytes / 2**20:.0f} MiB limit"
        )
    resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes))


_CUDA: dict[str, Any] = {}  # this probe process's measured CUDA context (one device)


def cuda_context(index: int) -> int:
    """The CUDA context's bytes, measured once per process (creating the context)."""
    if "context_bytes" not in _CUDA:
        _CUDA["context_bytes"], _CUDA["context_method"] = context.measure(index)
    return int(_CUDA["context_bytes"])


def baseline(device_kind: str, index: int) -> dict[str, Any]:
    """The memory this probe process holds before training, as the budget counts it.

    CPU: the data segment RLIMIT_DATA counts and the resident set, after the imports
    (an import-time reservation shows as the first far above the second), the set
    counted as the peak is (with the library pages a forked probe has not touched).
    CUDA: the context, and how it was measured."""
    if device_kind == DeviceKind.CUDA:
        cuda_context(index)
        return {k: v for k, v in _CUDA.items()}
    rss = footprint(device_kind, index)
    return {"vmdata_bytes": _proc_status_kib("VmData") * 1024, "rss_bytes": rss}


def footprint(device_kind: str, index: int) -> int:
    """What the process holds now, counted as its peak is: the resident set with the
    library pages a forked probe has not touched (CPU), or the allocator's reserve and
    the context (CUDA)."""
    if device_kind == DeviceKind.CUDA:
        import torch

        return int(torch.cuda.memory_reserved(index)) + cuda_context(index)
    return _proc_status_kib("VmRSS") * 1024 + fork_pages.untouched_bytes()


def setup_bytes(device_kind: str, index: int, baseline: dict[str, Any], model: Any) -> int | None:
    """What the job holds just before its first step beyond the process's `baseline` and
    the model's own tensors on the device: the Trainer, its data, the user's tokenizer
    and dataset. None where the baseline has no process term. Measured on the CPU: a
    probe of a 1.7M-parameter GPT-2 held 27.6 MiB more before its first step, a constant
    the activations' fit otherwise absorbed (docs/search.md)."""
    held = baseline.get("context_bytes" if device_kind == DeviceKind.CUDA else "rss_bytes")
    if not isinstance(held, int | float) or held <= 0:
        return None
    kind = "cuda" if device_kind == DeviceKind.CUDA else "cpu"
    # under ZeRO-3 a parameter's data is a placeholder and its partition `ds_tensor`
    tensors = [getattr(t, "ds_tensor", t) for t in (*model.parameters(), *model.buffers())]
    unique = {id(t): t for t in tensors}.values()
    model_bytes = sum(t.numel() * t.element_size() for t in unique if t.device.type == kind)
    return max(0, footprint(device_kind, index) - int(held) - int(model_bytes))


def synchronize(device_kind: str) -> None:
    """Wait for queued device work, so a timestamp means the work is done."""
    if device_kind == DeviceKind.CUDA:
        import torch

        torch.cuda.synchronize()


class StepMarks:
    """The ends of training steps. CPU: timestamps. CUDA: recorded events, read once
    after the window (one sync at each edge instead of one per step)."""

    def __init__(self, device_kind: str, clock: Callable[[], float] | None = None) -> None:
        self.kind = device_kind
        self.clock = clock or time.perf_counter
        self.ends: list[Any] = []
        self.host: list[float] = []  # host time at each mark (for a time-based window)
        self.started = False
        self.began = 0.0  # host time at the first step's start

    def start(self) -> None:
        synchronize(self.kind)
        self.started = True
        self.began = self.clock()

    def mark(self) -> None:
        now = self.clock()
        if self.kind == DeviceKind.CUDA:
            import torch

            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            self.ends.append(event)
        else:
            self.ends.append(now)
        self.host.append(now)

    def host_elapsed_since(self, mark: int) -> float:
        """Host seconds from the end of step `mark` (1-based; 0: the first) to the last."""
        return self.host[-1] - self.host[max(0, mark - 1)] if self.host else 0.0

    def host_elapsed(self, upto: int) -> float:
        """Host seconds from the first step's start to the end of step `upto` (1-based)."""
        return self.host[upto - 1] - self.began if 0 < upto <= len(self.host) else 0.0

    def durations(self) -> list[float]:
        """Each step's duration from the previous step's end (the first step has none)."""
        if self.kind == DeviceKind.CUDA:
            synchronize(self.kind)
            return [
                a.elapsed_time(b) / 1000 for a, b in zip(self.ends, self.ends[1:], strict=False)
            ]
        return [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)]


def memory_in_use(device_kind: str) -> int:
    """Bytes the budget counts right now (CPU: the data segment RLIMIT_DATA limits)."""
    if device_kind == DeviceKind.CUDA:
        import torch

        return int(torch.cuda.memory_reserved())
    return _proc_status_kib("VmData") * 1024


def peak_memory_bytes(device_kind: str, index: int) -> int:
    """Peak memory of this process: CPU resident set, or CUDA allocator peak + context."""
    if device_kind == DeviceKind.CUDA:
        import torch

        return int(torch.cuda.max_memory_reserved(index)) + cuda_context(index)
    # ru_maxrss is in KiB on Linux.
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    return peak + fork_pages.untouched_bytes()  # as a fresh process would count it


def device_name(device_kind: str, index: int) -> str:
    if device_kind == DeviceKind.CUDA:
        import torch

        return str(torch.cuda.get_device_name(index))
    return cpu_name()


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def describe_environment(device_kind: str, index: int) -> dict[str, Any]:
    """What a result was measured with. The versions are read as a search reads them
    before reusing a result (core/device.measuring_environment, without importing torch):
    from the installed metadata, where a CUDA wheel of torch says 2.11.0 and
    torch.__version__ 2.11.0+cu130 (seen on an H100; nothing measured there was ever
    reused)."""
    import torch

    return {
        **measuring_environment(),
        "torch_build": torch.__version__,
        "device": device_name(device_kind, index),
    }
