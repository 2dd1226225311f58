"""The device seam's logic, tested on the CPU: GPU-id mapping through the user's
CUDA_VISIBLE_DEVICES, the CUDA context lookup by UUID with a fake NVML, step marks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from autotune.core.device import DeviceInfo
from autotune.core.enums import DeviceKind
from autotune.core.errors import UsageError
from autotune.probe import device
from autotune.probe._cuda_context import nvml_used_bytes
from autotune.system import devices

A100 = DeviceInfo(DeviceKind.CUDA, 1, "A100", 80 * 2**30, (8, 0))


def test_a_gpu_index_maps_through_the_users_visible_devices() -> None:
    assert devices.visible_entry(1, "4,6") == "6"
    assert devices.visible_entry(0, "GPU-aaaa,GPU-bbbb") == "GPU-aaaa"
    assert devices.visible_entry(3, None) == "3"  # nothing set: the index is the GPU
    with pytest.raises(UsageError, match="shows 2 GPU"):
        devices.visible_entry(2, "4,6")


def test_a_single_process_probe_sees_exactly_its_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,7")
    assert devices.placement(A100, 1) == ("cuda:0", "5")  # --device cuda:1 is GPU 5
    assert devices.placement(A100, 2) == ("cuda:0", "2,5,7")  # DDP ranks pick by LOCAL_RANK
    cpu = DeviceInfo(DeviceKind.CPU, None, "cpu", 2**30)
    assert devices.placement(cpu, 1) == ("cpu", "")


class FakeNvml:
    """NVML as seen from a container or under MIG: what the lookup must cope with."""

    def __init__(self, processes: dict[str, list[Any]]) -> None:
        self.processes = processes
        self.looked_up: list[str] = []
        self.shut = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.looked_up.append(uuid)
        if uuid not in self.processes:
            raise KeyError(uuid)
        return uuid

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        return self.processes[handle]


def proc(pid: int, used: int | None) -> Any:
    return SimpleNamespace(pid=pid, usedGpuMemory=used)


def test_the_context_is_found_by_uuid_not_by_index() -> None:
    nvml = FakeNvml({"GPU-1234": [proc(7, 100), proc(42, 500 * 2**20)]})
    assert nvml_used_bytes(nvml, "1234", 42) == (500 * 2**20, "nvml-uuid")
    assert nvml.looked_up == ["GPU-1234"] and nvml.shut


def test_no_per_process_figure_falls_back_and_says_why() -> None:
    mig = FakeNvml({"MIG-9": [proc(42, None)]})
    used, why = nvml_used_bytes(mig, "MIG-9", 42)
    assert used is None and "MIG" in why
    container = FakeNvml({"GPU-1": [proc(31337, 10)]})  # NVML lists the host's pid
    used, why = nvml_used_bytes(container, "1", 42)
    assert used is None and "pid namespace" in why


def test_step_marks_time_whole_steps_from_each_previous_end() -> None:
    now = iter([-1.0, 0.0, 1.0, 1.5, 3.5])  # the first step's start, then 4 ends
    marks = device.StepMarks("cpu", clock=lambda: next(now))
    marks.start()
    for _ in range(4):
        marks.mark()
    assert marks.durations() == [1.0, 0.5, 2.0]
    assert marks.host_elapsed_since(2) == 2.5
    assert marks.host_elapsed(2) == 2.0  # from the first step's start to step 2's end


def test_importing_libraries_before_a_fork_reads_capabilities_without_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bitsandbytes asks every GPU's capability at import (through peft, under
    transformers.trainer); in the fork server that must not initialise CUDA."""
    import torch

    asked: list[int] = []
    monkeypatch.setattr(devices, "nvml_capability", lambda i: asked.append(i) or (9, 0))
    real = torch.cuda.get_device_capability
    with devices.capability_from_nvml():
        assert torch.cuda.get_device_capability(torch.cuda.device(1)) == (9, 0)
        assert torch.cuda.get_device_capability(0) == (9, 0)
        assert not torch.cuda.is_initialized()
    assert asked == [1, 0]
    assert torch.cuda.get_device_capability is real


def test_a_device_nvml_cannot_answer_for_falls_through_to_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    def no_nvml(index: int) -> tuple[int, int]:
        raise RuntimeError("no driver library")

    monkeypatch.setattr(devices, "nvml_capability", no_nvml)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 5))
    with devices.capability_from_nvml():
        assert torch.cuda.get_device_capability(0) == (7, 5)


def test_a_probe_runs_what_its_recipe_says_whatever_accelerates_variables_say(
    tmp_path: Any,
) -> None:
    """ACCELERATE_USE_CPU (set by `accelerate launch --cpu`) would drop DeepSpeed silently
    and put a GPU probe on the CPU; a one-process DeepSpeed run gets a world of one."""
    import os

    from autotune.probe.main import prepare_environment

    saved = dict(os.environ)  # the probe's environment must not leak into later tests
    try:
        for name in ("WORLD_SIZE", "RANK", "MASTER_PORT"):
            os.environ.pop(name, None)
        for name in ("ACCELERATE_USE_CPU", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DYNAMO_MODE"):
            os.environ[name] = "1"
        prepare_environment(
            compiles=False, trial_dir=str(tmp_path), visible_devices="", deepspeed=True
        )
        assert not any(n.startswith("ACCELERATE_") for n in os.environ)
        assert (os.environ["WORLD_SIZE"], os.environ["RANK"]) == ("1", "0")
        assert 0 < int(os.environ["MASTER_PORT"]) < 65536
    finally:
        os.environ.clear()
        os.environ.update(saved)
