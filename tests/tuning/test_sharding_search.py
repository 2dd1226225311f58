"""ZeRO through the real CLI on this CPU: two-process probes under gloo, a parity run
of DeepSpeed's bf16 in one process, and an export the user's script loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_GPT2, autotune, write_model

pytest.importorskip("deepspeed")


@pytest.mark.slow
def test_a_zero3_search_probes_checks_parity_and_exports_the_deepspeed_config(
    tmp_path: Path,
) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    done = autotune(
        tmp_path,
        "search",
        "--model",
        "./tiny",
        "--device",
        "cpu",
        "--lever",
        "torch_compile=false",
        "--lever",
        "attn_implementation=sdpa",
        "--lever",
        "zero_stage=3",
        "--nproc-per-node",
        "2",
        "--global-batch-size",
        "32",
        "--seq-len",
        "64",
        "--precisions",
        "bf16",
        "--optimizers",
        "adamw_torch",
        "--checkpointing",
        "off",
        "--max-trials",
        "2",
        "--warmup-steps",
        "1",
        "--measure-steps",
        "2",
        "--confirm-top",
        "0",
        "--parity",
        "quick",
        "--parity-steps",
        "8",
        "--memory-budget",
        "3GiB",
        "--sampler",
        "random",
        "--quiet",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # Both configs (8x2, 16x1) probed: two-process ZeRO-3 under a real 3 GiB limit each
    assert out.count(" ok       batch ") == 2 and " error " not in out, out
    # DeepSpeed's bf16 is its own arithmetic, trained in one process beside the recipe
    # (fp32 AdamW, the default), whichever config is faster
    assert "parity  bf16-adamw_torch-deepspeed batch" in out, out
    # 8 steps cannot verify it: --parity quick exports it unverified, and says so
    assert "parity  bf16 adamw_torch: unverified" in out, out
    assert "exported unverified (--parity on exports verified configs only)" in out, out
    args = json.loads((tmp_path / "studies" / "tiny.best.json").read_text())
    summary = json.loads((tmp_path / "studies" / "tiny.best.summary.json").read_text())
    assert summary["launch"] == "torchrun --nproc-per-node 2 your_script.py ARGS.json"
    assert args["deepspeed"]["zero_optimization"]["stage"] == 3
    assert any("pip install deepspeed" in line for line in summary["script_changes"])
    from transformers import HfArgumentParser, TrainingArguments

    parser = HfArgumentParser(TrainingArguments)  # type: ignore[arg-type]
    (loaded,) = parser.parse_dict({**args, "output_dir": str(tmp_path / "out")})
    micro, steps = loaded.per_device_train_batch_size, loaded.gradient_accumulation_steps
    assert micro * steps * 2 == 32 and loaded.deepspeed == args["deepspeed"]
