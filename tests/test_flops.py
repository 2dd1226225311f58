from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY_GPT2, write_model

from autotune.probe.flops import flops_per_sample, measure_peak_flops
from autotune.hf.models import build_model, resolve_model


def test_flops_per_sample_is_6n_per_token_plus_attention(tiny_gpt2: Path) -> None:
    model = build_model(resolve_model(str(tiny_gpt2)))
    params = sum(p.numel() for p in model.parameters())  # gpt2 ties its embeddings
    seq = 128
    expected = 6 * params * seq + 12 * 2 * 64 * seq * seq
    assert flops_per_sample(model, "causal-lm", seq, 0) == expected


def test_untied_input_embeddings_are_not_counted(tmp_path: Path) -> None:
    untied = write_model(tmp_path / "untied", {**TINY_GPT2, "tie_word_embeddings": False})
    model = build_model(resolve_model(str(untied)))
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    lookup = model.get_input_embeddings().weight.numel()
    params = sum(p.numel() for p in model.parameters())
    assert flops_per_sample(model, "causal-lm", 16, 0) == 6 * (params - lookup) * 16 + (
        12 * 2 * 64 * 16 * 16
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_peak_flops_is_measured(precision: str) -> None:
    assert measure_peak_flops("cpu", precision, seconds=0.2) > 1e8
