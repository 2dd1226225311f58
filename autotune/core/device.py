"""The device a study runs on, as a plain value, and what it can train in.

Detection and everything that touches `torch.cuda` or NVML live in
`autotune.probe.device`; this is the pure part the parent reasons with.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform

from autotune.core.enums import DeviceKind, Precision
from autotune.core.precisions import on_device


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    kind: DeviceKind
    index: int | None
    name: str
    total_memory_bytes: int
    capability: tuple[int, int] | None = None  # CUDA compute capability
    # A CPU with bf16 instructions (avx512_bf16, amx_bf16): its bf16 matmuls run natively
    # (oneDNN), not emulated, so bf16 is a good first guess there
    native_bf16: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", DeviceKind(self.kind))
        if self.capability is not None:
            object.__setattr__(self, "capability", tuple(self.capability))

    @property
    def torch_device(self) -> str:
        return "cpu" if self.kind == DeviceKind.CPU else f"cuda:{self.index or 0}"

    @property
    def alignment_tokens(self) -> int:
        """Tokens per micro-batch (batch x sequence: the rows of every linear layer's
        matrix multiply) whose multiples tensor cores tile best: 64 on Ampere and newer,
        8 on older GPUs; 1 on the CPU, which has no such tiles."""
        if self.kind != DeviceKind.CUDA:
            return 1
        return 64 if self.capability is not None and self.capability >= (8, 0) else 8


def supported_precisions(device: DeviceInfo) -> tuple[Precision, ...]:
    """Precisions this device can train in, as their declarations say (core/precisions.py)."""
    return on_device(device.kind, device.capability)


# The libraries whose release changes what a probe measures (kernels, memory, what the
# Trainer does): a result is reused only under the same release of each. DeepSpeed and
# Liger change every probe where installed (accelerate imports DeepSpeed); PEFT and TRL
# build the user's adapters and trainer; bitsandbytes runs the 8-bit optimizers.
MEASURING_LIBRARIES = (
    "torch",
    "transformers",
    "accelerate",
    "deepspeed",
    "peft",
    "trl",
    "bitsandbytes",
    "liger-kernel",
)


def measuring_environment() -> dict[str, str]:
    """What a result was measured with, read without importing any of it: each measuring
    library's installed version ("none": not installed), Python, and the cores this
    process may use. A probe records it; a search reuses a result only where it matches."""
    found = {name: package_version(name) for name in MEASURING_LIBRARIES}
    cores = str(len(os.sched_getaffinity(0)))
    return {**found, "python": platform.python_version(), "cpus": cores}


def package_version(name: str) -> str:
    """An installed distribution's version, without importing it ("none": not installed)."""

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "none"
