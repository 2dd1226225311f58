"""The machine as the search's processes see it: which device there is (`detect_device`,
the CPU's facts, a GPU's capability through NVML without a CUDA context), which GPU a
probe sees (`placement`), and the limits a probe process runs under
(`process_data_limit`, `min_window_s`). The parent and the probe both use it; what only a
probe does on its device (enforce the budget, synchronise, read its peak) is
`autotune.probe.device`."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.core.device import DeviceInfo
from autotune.core.enums import DeviceKind
from autotune.core.errors import UsageError

# Deferred imports: torch and NVML load only to detect a device; `show`, `export` and --help
# import this module without them


def detect_device(spec: str = "auto") -> DeviceInfo:
    """Resolve --device (auto, cpu, cuda, cuda:N) to the device and its capacity."""
    import torch

    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return DeviceInfo(
            DeviceKind.CPU,
            None,
            cpu_name(),
            cpu_memory_bytes(),
            native_bf16=bool(cpu_flags() & NATIVE_BF16),
        )
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

    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())
