"""--lora and --peft-config: the stand-in's LoRA adapter, read and checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_GPT2

from autotune.core.errors import UsageError
from autotune.core.trial import ModelSpec
from autotune.hf.models import count_parameters
from autotune.hf.peft import adapter_settings


def test_lora_settings_read_as_loraconfig_fields() -> None:
    assert adapter_settings("r=16,alpha=32,targets=q_proj,v_proj,dropout=0.05", None) == {
        "peft_type": "LORA",
        "r": 16,
        "lora_alpha": 32,
        "target_modules": ["q_proj", "v_proj"],
        "lora_dropout": 0.05,
    }
    assert adapter_settings("targets=all-linear", None)["target_modules"] == "all-linear"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("r=16", "name the layers to adapt"),
        ("rank=16,targets=q", "unknown setting 'rank'"),
        ("r=x,targets=q", "r must be a number, not 'x'"),
        ("q_proj", "'q_proj' is not NAME=VALUE"),
        ("r=0,targets=q", "r must be at least 1"),
    ],
)
def test_bad_lora_settings_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        adapter_settings(text, None)


def test_an_adapter_config_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps({"peft_type": "LORA", "r": 8, "target_modules": ["c_attn"]}))
    assert adapter_settings(None, path)["target_modules"] == ["c_attn"]
    path.write_text(json.dumps({"peft_type": "PREFIX_TUNING"}))
    with pytest.raises(UsageError, match=r"give a LoRA adapter_config\.json"):
        adapter_settings(None, path)
    with pytest.raises(UsageError, match="give one"):
        adapter_settings("targets=q", path)


def test_a_lora_stand_in_trains_only_its_adapter() -> None:
    plain = ModelSpec("tiny", "local", "causal-lm", TINY_GPT2)
    adapted = ModelSpec(
        "tiny", "local", "causal-lm", TINY_GPT2, adapter={"r": 4, "target_modules": ["c_attn"]}
    )
    full, lora = count_parameters(plain), count_parameters(adapted)
    # c_attn: 2 layers x (64 in + 192 out) x r=4 adapter weights
    assert lora.trainable == 2 * (64 + 192) * 4
    assert lora.total == full.total + lora.trainable and full.trainable == 0
