"""The levers that need a GPU, where they run: liger kernels, flex attention and
compilation with Triton. Marked `cuda`: skipped without a GPU (see conftest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.core.enums import DeviceKind
from autotune.core.trial import Candidate, ModelSpec, Outcome, TrialConfig
from autotune.hf.levers import offer
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
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 4096,
        "max_position_embeddings": 512,
    },
)


def probe(tmp_path: Path, name: str, **levers: object) -> TrialConfig:
    candidate = Candidate(8, 1, "bf16", False, "adamw_torch", **levers)  # type: ignore[arg-type]
    return TrialConfig(
        number=0,
        trial_dir=str(tmp_path / name),
        model=LLAMA,
        candidate=candidate,
        device="cuda:0",
        seq_len=256,
        target_len=0,
        memory_limit_bytes=8 * 2**30,
        warmup_steps=3,
        measure_steps=5,
    )


def test_on_a_gpu_compilation_and_flex_attention_are_offered() -> None:
    levers, _ = offer(LLAMA, DeviceKind.CUDA, dataset=False, fixed={}, asked={})
    found = dict(levers)
    assert found["torch_compile"] == (False, True)
    assert "flex_attention" in found["attn_implementation"]


def test_liger_kernels_are_offered_for_llama_and_a_probe_runs_with_them(tmp_path: Path) -> None:
    pytest.importorskip("liger_kernel")
    levers, _ = offer(LLAMA, DeviceKind.CUDA, dataset=False, fixed={}, asked={})
    assert dict(levers)["use_liger_kernel"] == (False, True)
    plain = run_trial(probe(tmp_path, "plain"), timeout_s=600)
    liger = run_trial(probe(tmp_path, "liger", use_liger_kernel=True), timeout_s=600)
    assert plain.outcome == liger.outcome == Outcome.OK, liger.reason
    # the fused linear cross-entropy never holds the whole logits tensor
    assert (liger.peak_memory_bytes or 0) < (plain.peak_memory_bytes or 0)


def test_flex_attention_and_compilation_run_on_the_gpu(tmp_path: Path) -> None:
    flex = run_trial(probe(tmp_path, "flex", attn_implementation="flex_attention"), timeout_s=600)
    assert flex.outcome == Outcome.OK, flex.reason
    assert flex.attention == "flex_attention"
    compiled = run_trial(probe(tmp_path, "compiled", torch_compile=True), timeout_s=600)
    assert compiled.outcome == Outcome.OK, compiled.reason
    assert compiled.one_time_s is not None and compiled.one_time_s > 1.0
