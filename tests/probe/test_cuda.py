"""The CUDA path on a real GPU: each item of the device seam, checked where it runs.

Every test here is marked `cuda` and skips cleanly without a GPU (see conftest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_GPT2

from autotune.core.enums import Outcome
from autotune.core.trial import Candidate, ModelSpec, TrialConfig
from autotune.launch.forkserver import ForkServer
from autotune.launch.runner import run_trial

pytestmark = [pytest.mark.cuda, pytest.mark.slow]
GIB = 2**30


def python(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={**os.environ, **env},
    )
    return done.stdout


def probe(tmp_path: Path, name: str, **kw: object) -> TrialConfig:
    args: dict[str, object] = dict(
        number=0,
        trial_dir=str(tmp_path / name),
        model=ModelSpec("t", "local", "causal-lm", TINY_GPT2),
        candidate=Candidate(8, 1, "fp32", False, "adamw_torch"),
        device="cuda:0",
        seq_len=64,
        target_len=0,
        memory_limit_bytes=4 * GIB,
        warmup_steps=2,
        measure_steps=5,
    )
    args.update(kw)
    return TrialConfig(**args)  # type: ignore[arg-type]


def test_the_context_is_measured_and_left_out_of_the_allocator_cap() -> None:
    out = python(
        "import torch\n"
        "from autotune.probe import device\n"
        "device.enforce_memory_limit('cuda', 0, 2 * 2**30)\n"
        "ctx = device.cuda_context(0)\n"
        "total = torch.cuda.get_device_properties(0).total_memory\n"
        "print(ctx, device._CUDA['context_method'], device._CUDA['cap_bytes'])\n"
    )
    context, method, cap = out.split()[0], out.split()[1], out.split()[-1]
    assert 50 * 2**20 < int(context) < 2 * GIB, out  # a CUDA context is 0.3-1 GiB
    assert int(cap) <= 2 * GIB - int(context) + 2**20, out
    assert method.startswith(("nvml-uuid", "mem_get_info")), out


def test_a_probe_sees_exactly_one_gpu(tmp_path: Path) -> None:
    """Trainer runs nn.DataParallel over every visible GPU; a probe must see one."""
    out = (
        python(
            "import os\n"
            "from autotune.core.trial import TrialConfig\n"
            "from autotune.probe.main import prepare_environment\n"
            "import torch\n"
            f"c = TrialConfig.from_json(open({str(tmp_path / 'c.json')!r}).read())\n"
            "prepare_environment(compiles=False, trial_dir=c.trial_dir,\n"
            "    visible_devices=c.visible_devices, deepspeed=False)\n"
            "print(torch.cuda.device_count(), os.environ['CUDA_VISIBLE_DEVICES'])\n",
        )
        if (tmp_path / "c.json").write_text(probe(tmp_path, "x", visible_devices="0").to_json())
        else ""
    )
    assert out.split() == ["1", "0"]


def test_an_allocation_over_the_cap_is_a_typed_oom_and_the_next_probe_is_clean(
    tmp_path: Path,
) -> None:
    # 4096 x 256 tokens: the logits alone are 2 GiB (the tiny model has 256 positions;
    # a longer sequence is an indexing error, a device-side assert on CUDA, not an OOM)
    big = probe(
        tmp_path,
        "big",
        candidate=Candidate(4096, 1, "fp32", False, "adamw_torch"),
        seq_len=256,
        memory_limit_bytes=2 * GIB,
    )
    result = run_trial(big, timeout_s=300)
    assert result.outcome == Outcome.OOM, result
    assert "OutOfMemoryError" in result.error or "out of memory" in result.error
    after = run_trial(probe(tmp_path, "after"), timeout_s=300)
    assert after.outcome == Outcome.OK and after.baseline["context_bytes"] > 0


def test_the_fork_server_leaves_cuda_uninitialised(tmp_path: Path) -> None:
    server = ForkServer(tmp_path / "fs.log", data_limit=None)
    try:
        assert not server.fresh_only, (tmp_path / "fs.log").read_text()
        result = run_trial(probe(tmp_path, "forked"), timeout_s=300, server=server)
        assert result.outcome == Outcome.OK, result.reason
    finally:
        server.close()


def test_fast_steps_are_measured_by_time_not_by_count(tmp_path: Path) -> None:
    result = run_trial(probe(tmp_path, "fast", min_measure_s=2.0), timeout_s=300)
    assert result.outcome == Outcome.OK, result.reason
    assert len(result.step_times_s) >= 20 and sum(result.step_times_s) >= 1.9


def test_fp16_fused_adamw_skips_are_seen_through_the_loss_scale(tmp_path: Path) -> None:
    """An initial scale of 2**16 overflows for a few steps: seen (not hidden by the fused
    optimizer), and counted as calibration, not instability."""
    fused = probe(
        tmp_path,
        "fused",
        candidate=Candidate(8, 1, "fp16", False, "adamw_torch_fused"),
        warmup_steps=1,
        measure_steps=10,
    )
    result = run_trial(fused, timeout_s=300)
    assert result.outcome == Outcome.OK, result.reason


@pytest.mark.skipif(
    not os.path.exists("/dev/nvidia1"), reason="needs two GPUs for a 2-rank NCCL probe"
)
def test_a_two_rank_nccl_probe_runs_and_leaves_no_process(tmp_path: Path) -> None:
    result = run_trial(probe(tmp_path, "ddp", nproc_per_node=2), timeout_s=300)
    assert result.outcome == Outcome.OK, result.reason
    assert result.versions["world_size"] == "2"


@pytest.mark.skipif(
    not os.path.exists("/dev/nvidia1"), reason="needs two GPUs for a 2-rank ZeRO probe"
)
@pytest.mark.parametrize("stage", [2, 3])
def test_two_rank_zero_probes_run_on_gpus(tmp_path: Path, stage: int) -> None:
    """Written against DeepSpeed's documented API; not yet run (no two-GPU machine)."""
    pytest.importorskip("deepspeed")
    from autotune.core.enums import DeviceKind
    from autotune.hf.training_args import tuned_arguments

    candidate = Candidate(8, 1, "bf16", False, "adamw_torch", zero_stage=stage)
    args = tuned_arguments(candidate, device_kind=DeviceKind.CUDA)
    config = probe(
        tmp_path, f"zero{stage}", candidate=candidate, nproc_per_node=2, training_arguments=args
    )
    result = run_trial(config, timeout_s=600)
    assert result.outcome == Outcome.OK, result.reason
    assert result.versions["world_size"] == "2" and result.peak_memory_bytes
