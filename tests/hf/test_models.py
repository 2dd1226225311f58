from __future__ import annotations

import time
from pathlib import Path

import pytest

from autotune.core.errors import ModelConfigError, ModelNotFoundError, UsageError
from autotune.hf.models import build_model, detect_task, preset_names, resolve_model


def test_local_directory_is_resolved_first(tiny_gpt2: Path) -> None:
    spec = resolve_model(str(tiny_gpt2))
    assert spec.source == "local"
    assert spec.task == "causal-lm"
    assert spec.config["n_embd"] == 64


@pytest.mark.parametrize(
    "name", ["google/mt5-small", "t5-small", "bert-large-uncased", "gpt2", "EleutherAI/pythia-160m"]
)
def test_bundled_presets_resolve_offline(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = resolve_model(name)
    assert spec.source in ("preset", "cache")
    assert name in preset_names()


def test_preset_tasks_and_published_sizes() -> None:
    mt5 = resolve_model("google/mt5-small")
    assert mt5.task == "seq2seq" and mt5.config["vocab_size"] == 250112
    assert resolve_model("bert-large-uncased").task == "masked-lm"
    assert resolve_model("EleutherAI/pythia-160m").task == "causal-lm"


def test_unknown_model_names_the_three_places_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("nobody/no-such-model")
    message = str(info.value)
    assert "local directory" in message and "Hugging Face cache or hub" in message
    assert "bundled preset" in message and "google/mt5-small" in message
    assert time.monotonic() - started < 5


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match=r"has no config\.json"):
        resolve_model(str(tmp_path))


def test_malformed_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match=r"not valid JSON"):
        resolve_model(str(tmp_path))


def test_missing_path() -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model("./no/such/dir")


def test_task_can_be_forced(tiny_gpt2: Path) -> None:
    assert resolve_model(str(tiny_gpt2), task="classification").task == "classification"
    with pytest.raises(UsageError, match="--task 'regression' is not one of auto, "):
        resolve_model(str(tiny_gpt2), task="regression")


@pytest.mark.parametrize(
    ("config", "task"),
    [
        ({"architectures": ["MT5ForConditionalGeneration"]}, "seq2seq"),
        ({"architectures": ["LlamaForCausalLM"]}, "causal-lm"),
        ({"architectures": ["GPT2LMHeadModel"]}, "causal-lm"),
        ({"architectures": ["RobertaForMaskedLM"]}, "masked-lm"),
        ({"architectures": ["BertForSequenceClassification"]}, "classification"),
        ({"model_type": "t5", "is_encoder_decoder": True}, "seq2seq"),
        ({"model_type": "llama"}, "causal-lm"),
        ({"model_type": "vit"}, None),
    ],
)
def test_detect_task(config: dict[str, object], task: str | None) -> None:
    assert detect_task(config) == task


def test_build_model_with_random_weights(tiny_t5: Path) -> None:
    model = build_model(resolve_model(str(tiny_t5)))
    assert type(model).__name__ == "T5ForConditionalGeneration"
    assert model.config.d_model == 64
