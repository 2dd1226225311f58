"""The device seam: everything that differs between the CPU and CUDA lives here.

The parent uses `detect_device` and `supported_precisions`; the child uses
`enforce_memory_budget`, `synchronize`, `memory_in_use` and `peak_memory_bytes`.
Only this module touches `torch.cuda` and NVML.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import resource
from pathlib import Path
from typing import Any

from autotune.core.errors import UsageError


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" or "cuda"
    index: int | None
    name: str
    total_memory_bytes: int
    capability: tuple[int, int] | None = None  # CUDA compute capability

    @property
    def torch_device(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index or 0}"

    @property
    def prefers_multiples_of_64(self) -> bool:
        """Ampere and newer tensor cores run best with batch dimensions in multiples of 64."""
        return self.capability is not None and self.capability >= (8, 0)


def detect_device(spec: str = "auto") -> DeviceInfo:
    """Resolve --device (auto, cpu, cuda, cuda:N) to the device and its capacity."""
    import torch

    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return DeviceInfo("cpu", None, cpu_name(), cpu_memory_bytes())
    if not spec.startswith("cuda") and spec != "auto":
        raise UsageError(f"--device {spec!r} is not one of auto, cpu, cuda, cuda:N")
    if not torch.cuda.is_available():
        raise UsageError(f"--device {spec}: no CUDA GPU is visible to torch; use --device cpu")
    index = int(spec.split(":", 1)[1]) if ":" in spec else 0
    if index >= torch.cuda.device_count():
        raise UsageError(
            f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) are visible"
        )
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(
        "cuda", index, props.name, int(props.total_memory), (props.major, props.minor)
    )


def supported_precisions(device: DeviceInfo) -> tuple[str, ...]:
    """Precisions this device can train in, checked against what transformers accepts."""
    if device.kind == "cpu":
        # tf32 is a CUDA tensor-core mode; TrainingArguments refuses it without Ampere.
        return ("fp32", "fp16", "bf16")
    major_minor = device.capability or (0, 0)
    precisions = ["fp32"]
    if major_minor >= (8, 0):
        precisions.append("tf32")
    if major_minor >= (6, 0):
        precisions.append("fp16")
    if major_minor >= (8, 0):
        precisions.append("bf16")
    return tuple(precisions)


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


def enforce_memory_budget(device_kind: str, index: int, budget_bytes: int) -> None:
    """Make an over-budget config fail with the allocator's own out-of-memory error.

    CPU: RLIMIT_DATA caps the process's data segment, so malloc (and torch's
    DefaultCPUAllocator) fails at the budget. CUDA: the caching allocator is capped at
    the budget minus the CUDA context, which the allocator does not see.
    """
    if device_kind == "cpu":
        resource.setrlimit(resource.RLIMIT_DATA, (budget_bytes, budget_bytes))
        return
    import torch

    torch.cuda.init()  # type: ignore[no-untyped-call]
    total = torch.cuda.get_device_properties(index).total_memory
    context = _cuda_context_bytes(index)
    fraction = max(0.0, min(1.0, (budget_bytes - context) / total))
    torch.cuda.set_per_process_memory_fraction(fraction, index)


def synchronize(device_kind: str) -> None:
    """Wait for queued device work, so a timestamp means the work is done."""
    if device_kind == "cuda":
        import torch

        torch.cuda.synchronize()


def memory_in_use(device_kind: str) -> int:
    """Bytes the budget counts right now (CPU: the data segment RLIMIT_DATA limits)."""
    if device_kind == "cuda":
        import torch

        return int(torch.cuda.memory_reserved())
    return _proc_status_kib("VmData") * 1024


def peak_memory_bytes(device_kind: str, index: int) -> int:
    """Peak memory of this process: CPU resident set, or CUDA allocator peak + context."""
    if device_kind == "cuda":
        import torch

        return int(torch.cuda.max_memory_reserved(index)) + _cuda_context_bytes(index)
    # ru_maxrss is in KiB on Linux.
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    return peak + untouched_library_bytes()


FORK_RSS_FILE_ENV = "AUTOTUNE_SERVER_RSS_FILE"


def untouched_library_bytes() -> int:
    """File-backed pages (shared libraries) a forked child has not touched.

    A child forked from the pre-imported server does not count the libraries' pages
    in its resident set until it touches them (fork does not copy those page tables),
    while a fresh training process, having loaded them, counts them all. Adding the
    server's file-backed resident pages the child lacks keeps the two comparable.
    """
    server = os.environ.get(FORK_RSS_FILE_ENV)
    if not server:
        return 0
    return max(0, int(server) - _proc_status_kib("RssFile") * 1024)


def device_name(device_kind: str, index: int) -> str:
    if device_kind == "cuda":
        import torch

        return str(torch.cuda.get_device_name(index))
    return cpu_name()


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _cuda_context_bytes(index: int) -> int:
    """Memory NVML charges this process beyond what torch's allocator has reserved."""
    import torch

    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        used = 0
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory:
                used = int(proc.usedGpuMemory)
        pynvml.nvmlShutdown()
    except Exception:  # NVML missing or not permitted: count no context, say so nowhere worse
        return 0
    return max(0, used - int(torch.cuda.memory_reserved(index)))


def describe_environment(device_kind: str, index: int) -> dict[str, Any]:
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": device_name(device_kind, index),
    }
