"""The memory a CUDA process holds outside torch's allocator: its context, the cuBLAS
workspace, loaded kernels. The allocator's cap must leave room for it, and a trial's peak
must count it (the design notes' "memory, precisely").

Measured after the context exists (a first allocation and a matrix multiply create it),
by one of two methods, recorded with the figure:

- NVML, this process's used memory on the device found by UUID (NVML numbers physical
  GPUs; torch numbers the visible ones);
- `torch.cuda.mem_get_info` when NVML has no per-process figure: under MIG
  (`usedGpuMemory` is None) or in a container whose pid namespace NVML does not see
  (it lists host pids). That counts every process on the GPU, which for a probe that
  has its GPU to itself is the probe.
"""

from __future__ import annotations

import os
from typing import Any

# Deferred imports: torch and NVML load only when a CUDA probe measures its context


def nvml_used_bytes(nvml: Any, uuid: str, pid: int) -> tuple[int | None, str]:
    """This pid's used memory on the GPU with this UUID, and how it was found; None when
    NVML has no per-process figure for it."""
    try:
        nvml.nvmlInit()
    except Exception as exc:  # no driver library, no permission
        return None, f"NVML unavailable ({type(exc).__name__})"
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(_nvml_uuid(uuid))
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid != pid:
                continue
            if proc.usedGpuMemory is None:
                return None, "NVML has no per-process figure (MIG)"
            return int(proc.usedGpuMemory), "nvml-uuid"
        return None, "NVML does not list this pid (another pid namespace)"
    except Exception as exc:
        return None, f"NVML lookup failed ({type(exc).__name__})"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _nvml_uuid(uuid: str) -> str:
    """torch's device UUID in the form NVML looks up ('GPU-...'; MIG ones as they are)."""
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def measure(index: int) -> tuple[int, str]:
    """(context bytes, method) for device `index` of this process; creates the context."""
    import torch

    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    x = torch.ones((256, 256), device=device)
    (x @ x).sum().item()  # the context, the cuBLAS handle and its workspace now exist
    torch.cuda.synchronize(device)
    reserved = int(torch.cuda.memory_reserved(device))
    try:
        import pynvml

        uuid = str(torch.cuda.get_device_properties(index).uuid)
        used, method = nvml_used_bytes(pynvml, uuid, os.getpid())
    except ImportError:
        used, method = None, "nvidia-ml-py not installed"
    if used is None:
        free, total = torch.cuda.mem_get_info(device)
        used, method = int(total - free), f"mem_get_info ({method})"
    del x
    return max(0, used - reserved), method
