from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from autotune.core.device import DeviceInfo
from autotune.probe.device import peak_memory_bytes
from autotune.system.devices import detect_device

GIB = 2**30


def test_cpu_device_reports_its_memory() -> None:
    cpu = detect_device("cpu")
    assert cpu.kind == "cpu" and cpu.torch_device == "cpu"
    assert cpu.total_memory_bytes > GIB
    assert cpu.alignment_tokens == 1


def test_tensor_core_tiles_are_stated_in_tokens() -> None:
    assert DeviceInfo("cuda", 0, "A100", 80 * GIB, (8, 0)).alignment_tokens == 64
    assert DeviceInfo("cuda", 0, "V100", 16 * GIB, (7, 0)).alignment_tokens == 8


def test_cpu_budget_is_a_real_allocator_limit() -> None:
    code = (
        "import torch\n"
        "from autotune.probe.device import enforce_memory_limit\n"
        "enforce_memory_limit('cpu', 0, 1024 * 2**20)\n"
        "try:\n"
        "    torch.empty(2 * 2**30, dtype=torch.uint8).fill_(1)\n"
        "except RuntimeError as exc:\n"
        "    print('refused:', 'allocate' in str(exc))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "refused: True" in done.stdout


def test_cpu_peak_is_the_resident_set_high_water_mark() -> None:
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert peak_memory_bytes("cpu", 0) == rss_kib * 1024


@pytest.mark.cuda
def test_cuda_budget_caps_the_allocator() -> None:
    code = (
        "import torch\n"
        "from autotune.probe.device import enforce_memory_limit, peak_memory_bytes\n"
        "enforce_memory_limit('cuda', 0, 2 * 2**30)\n"
        "x = torch.empty(2**28, dtype=torch.uint8, device='cuda')\n"
        "try:\n"
        "    torch.empty(3 * 2**30, dtype=torch.uint8, device='cuda')\n"
        "except torch.OutOfMemoryError:\n"
        "    print('refused', peak_memory_bytes('cuda', 0) >= 2**28)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "refused True" in done.stdout


@pytest.mark.cuda
def test_cuda_device_detection() -> None:
    gpu = detect_device("cuda:0")
    assert gpu.kind == "cuda" and gpu.capability is not None and gpu.total_memory_bytes > GIB


def test_a_probe_records_its_versions_as_a_reusing_search_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CUDA wheel's torch says 2.11.0+cu130 where its metadata says 2.11.0 (an H100):
    recorded from torch.__version__, no result there was ever reused."""
    import torch

    from autotune.core.device import measuring_environment
    from autotune.probe.device import describe_environment

    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    recorded = describe_environment("cpu", 0)
    assert {k: recorded[k] for k in measuring_environment()} == measuring_environment()
    assert recorded["torch_build"] == "2.11.0+cu130"  # the build, kept for the record
