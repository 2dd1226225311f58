"""The device seam: everything that differs between the CPU and CUDA lives here.

The parent uses `detect_device` and `supported_precisions`; the child uses
`enforce_memory_budget`, `synchronize`, `memory_in_use` and `peak_memory_bytes`.
Only this module (and `cuda_context`, which measures the context for it) touches
`torch.cuda`, NVML and `torch.backends`.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from autotune.core.device import DeviceInfo, measuring_environment
from autotune.core.enums import DeviceKind
from autotune.core.errors import UsageError
from autotune.probe import fork_pages


def detect_device(spec: str = "auto") -> DeviceInfo:
    """Resolve --device (auto, cpu, cuda, cuda:N) to the device and its capacity."""
    import torch

    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return DeviceInfo(DeviceKind.CPU, None, cpu_name(), cpu_memory_bytes(),
                          native_bf16=bool(cpu_flags() & NATIVE_BF16))  # fmt: skip
    kind, _, number = spec.partition(":")
    if spec != "auto" and (kind != "cuda" or (number and not number.isdigit())):
        raise UsageError(f"--device {spec!r} is not one of auto, cpu, cuda, cuda:N (N a number)")
    if not torch.cuda.is_available():
        raise UsageError(f"--device {spec}: no CUDA GPU is visible to torch; use --device cpu")
    index = int(number) if number else 0
    if index >= torch.cuda.device_count():
        raise UsageError(
            f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) are visible"
        )
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(
        DeviceKind.CUDA, index, props.name, int(props.total_memory), (props.major, props.minor)
    )


def cuda_device_count() -> int:
    """GPUs this process sees (0 without CUDA)."""
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def visible_entry(index: int, visible: str | None = None) -> str:
    """The CUDA_VISIBLE_DEVICES entry that makes the `index`-th GPU this process sees the
    only one a child sees: mapped through the user's own CUDA_VISIBLE_DEVICES, if set."""
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(index)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not 0 <= index < len(entries):
        raise UsageError(
            f"GPU {index} is not visible: CUDA_VISIBLE_DEVICES={visible!r} shows "
            f"{len(entries)} GPU(s), numbered 0 to {len(entries) - 1}"
        )
    return entries[index]


NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})  # x86 flags of bf16 dot products


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (Linux; none elsewhere)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def cpu_memory_bytes() -> int:
    """Physical memory, or the cgroup's limit when that is smaller."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return int(total)


# ---- child side -------------------------------------------------------------------------


def enforce_memory_budget(device_kind: str, index: int, limit_bytes: int) -> None:
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
        from autotune.probe import cuda_context as context

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
    rss = _proc_status_kib("VmRSS") * 1024 + fork_pages.untouched_bytes()
    return {"vmdata_bytes": _proc_status_kib("VmData") * 1024, "rss_bytes": rss}


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


def min_window_s(device_kind: str) -> float:
    """Measure by time where steps are fast: 2 s on CUDA (small models step in 20-50 ms,
    so a fixed 5 steps would be a tenth of a second); by steps on the CPU."""
    return 2.0 if device_kind == DeviceKind.CUDA else 0.0


def placement(device: DeviceInfo, nproc_per_node: int) -> tuple[str, str]:
    """(torch device, CUDA_VISIBLE_DEVICES) for a probe of this device: a single-process
    probe sees exactly its one GPU, as cuda:0; DDP ranks see what the search sees."""
    if device.kind != DeviceKind.CUDA:
        return "cpu", ""
    if nproc_per_node > 1:
        return "cuda:0", os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return "cuda:0", visible_entry(device.index or 0)


def process_data_limit(device_kind: DeviceKind, memory_limit_bytes: int | None) -> int | None:
    """The RLIMIT_DATA a probe process (and the fork server it comes from) runs under:
    the memory limit on the CPU; none on CUDA, where the allocator is capped instead."""
    return memory_limit_bytes if device_kind == DeviceKind.CPU else None


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


def nvml_capability(index: int) -> tuple[int, int]:
    """The compute capability of the `index`-th visible GPU, read through NVML: unlike
    torch.cuda.get_device_capability it creates no CUDA context. Raises when NVML cannot
    answer (no driver library, an entry it cannot resolve)."""
    import pynvml

    entry = visible_entry(index)
    pynvml.nvmlInit()
    try:
        if entry.startswith(("GPU-", "MIG-")):
            handle = pynvml.nvmlDeviceGetHandleByUUID(entry)
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(entry))
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return int(major), int(minor)
    finally:
        pynvml.nvmlShutdown()


@contextlib.contextmanager
def capability_from_nvml() -> Iterator[None]:
    """While importing libraries before a fork: answer torch.cuda.get_device_capability
    from NVML instead of initialising CUDA.

    bitsandbytes reads every GPU's capability when it is imported (to pick its native
    library), and transformers.trainer imports it through peft when peft is installed:
    that initialised CUDA in the fork server, and every probe fell back to a fresh
    process. Devices NVML cannot answer for fall through to torch's own call."""
    import torch

    real = torch.cuda.get_device_capability

    def capability(device: Any = None) -> tuple[int, int]:
        index = device if isinstance(device, int) else getattr(device, "idx", None)
        if index is None:
            index = getattr(device, "index", None) or 0
        try:
            return nvml_capability(int(index))
        except Exception:
            return real(device)

    torch.cuda.get_device_capability = capability
    try:
        yield
    finally:
        torch.cuda.get_device_capability = real


def cuda_initialized() -> bool:
    """Whether this process created a CUDA context (a fork after that is unsafe)."""
    import sys

    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


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
