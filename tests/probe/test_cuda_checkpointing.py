"""Graded checkpointing where offload means something: on a GPU. Marked `cuda`: skipped
without one (see conftest)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.core.checkpointing import Checkpointing
from autotune.core.trial import Candidate, ModelSpec, Outcome, TrialConfig
from autotune.launch.runner import run_trial

pytestmark = [pytest.mark.cuda, pytest.mark.slow]
LLAMA = ModelSpec(
    "llama",
    "local",
    "causal-lm",
    {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 1024,
        "max_position_embeddings": 1024,
    },
)


def test_each_level_holds_less_gpu_memory_than_the_one_before(tmp_path: Path) -> None:
    """4 layers, 8 x 1024 tokens in bf16: every level runs, and the device's peak falls
    along the levels; offloaded, the checkpointed inputs leave the GPU."""
    plain = TrialConfig(
        number=0,
        trial_dir="",
        model=LLAMA,
        candidate=Candidate(8, 1, "bf16", Checkpointing.OFF, "adamw_torch"),
        device="cuda:0",
        seq_len=1024,
        target_len=0,
        memory_limit_bytes=16 * 2**30,
        warmup_steps=2,
        measure_steps=3,
    )
    peaks = []
    for level in Checkpointing:
        candidate = dataclasses.replace(plain.candidate, activation_checkpointing=level)
        config = dataclasses.replace(plain, candidate=candidate, trial_dir=str(tmp_path / level))
        result = run_trial(config, timeout_s=600)
        assert result.outcome == Outcome.OK, (level, result.reason)
        peaks.append(result.peak_memory_bytes or 0)
    assert peaks == sorted(peaks, reverse=True), peaks
    off, _, _, on, offload = peaks
    assert on < off and offload < on, peaks
