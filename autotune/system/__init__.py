"""The operating system and the devices, as autotune's processes see them: device
detection (`devices`) and process control (`process`). Imports only `core`; a public
name imports its module on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._exports import lazy_exports

if TYPE_CHECKING:
    from autotune.system.devices import (
        capability_from_nvml,
        cpu_memory_bytes,
        cpu_name,
        cuda_device_count,
        cuda_initialized,
        detect_device,
        process_data_limit,
        visible_entry,
    )
    from autotune.system.process import child_env, die_with_parent, dies_with, kill_group, stop

__all__ = [
    "capability_from_nvml",
    "child_env",
    "cpu_memory_bytes",
    "cpu_name",
    "cuda_device_count",
    "cuda_initialized",
    "detect_device",
    "die_with_parent",
    "dies_with",
    "kill_group",
    "process_data_limit",
    "stop",
    "visible_entry",
]

# each public name, and the module that holds it
_OWNERS = {
    "capability_from_nvml": "autotune.system.devices",
    "cpu_memory_bytes": "autotune.system.devices",
    "cpu_name": "autotune.system.devices",
    "cuda_device_count": "autotune.system.devices",
    "cuda_initialized": "autotune.system.devices",
    "detect_device": "autotune.system.devices",
    "process_data_limit": "autotune.system.devices",
    "visible_entry": "autotune.system.devices",
    "child_env": "autotune.system.process",
    "die_with_parent": "autotune.system.process",
    "dies_with": "autotune.system.process",
    "kill_group": "autotune.system.process",
    "stop": "autotune.system.process",
}
__getattr__ = lazy_exports(__name__, _OWNERS)
