"""What a built job holds, read as the survey reads it: each parameter's dtype or
quantization, a quantized base's settings, checkpointing a factory turned on itself,
and the data's lengths (read as Arrow, not as Python lists)."""

from __future__ import annotations

import pytest
from helpers import loaded_llama

from autotune.hf.job import (
    checkpointing,
    fused_head,
    held_dtypes,
    longest_first,
    longest_samples,
    quantization_settings,
    sample_lengths,
)
from autotune.hf.models import parameter_count


def test_a_bf16_checkpoint_is_held_in_bf16_with_fp32_adapters() -> None:
    model = loaded_llama(quantized=False)
    held = held_dtypes(model)
    assert set(held) == {"frozen bfloat16", "trainable float32"}
    counted = parameter_count(model)
    assert counted.frozen_bytes == 2 * held["frozen bfloat16"]
    assert quantization_settings(model.get_base_model()) == {}
    assert not checkpointing(model.get_base_model())


def test_a_4bit_base_is_read_with_its_quantization_and_forced_checkpointing() -> None:
    base = loaded_llama(quantized=True).get_base_model()
    assert quantization_settings(base) == {
        "method": "bitsandbytes",
        "bits": 4,
        "quant_type": "nf4",
        "compute_dtype": "bfloat16",
        "double_quant": True,
    }
    assert "frozen 4-bit nf4" in held_dtypes(base)
    # prepare_model_for_kbit_training turned it on; nothing in the Trainer turns it off
    assert checkpointing(base)


def test_a_model_trl_gave_a_fused_lm_head_is_seen_as_folding_its_logits() -> None:
    """SFTTrainer patches the base model's forward with TRL's fused LM head, which keeps
    the model's own name: the survey tells it by its code."""
    from trl.trainer.utils import add_fused_lm_head

    model = loaded_llama(quantized=False)
    base = model.get_base_model()
    assert not fused_head(base) and not fused_head(model)
    add_fused_lm_head(base, outputs=("log_probs", "entropy", "is_top1"))
    assert fused_head(base) and base.forward.__name__ == "forward"


@pytest.mark.parametrize("column", ["input_ids", "length"])
def test_lengths_come_from_the_column_in_the_dataset_order(column: str) -> None:
    from datasets import Dataset

    rows = [[1] * n for n in (3, 7, 1, 5)]
    values = rows if column == "input_ids" else [len(r) for r in rows]
    dataset = Dataset.from_dict({column: values})
    assert sample_lengths(dataset) == [3, 7, 1, 5]
    assert sample_lengths(dataset.select([3, 1])) == [5, 7]  # a selection is honoured
    assert sample_lengths(Dataset.from_dict({"text": ["a"]})) is None


def test_probes_train_on_the_longest_samples_the_survey_found_without_reading_lengths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from datasets import Dataset

    dataset = Dataset.from_dict({"input_ids": [[1] * n for n in (3, 7, 1, 5, 7)]})
    known = longest_first(sample_lengths(dataset) or [], 4096)
    assert known == [1, 4, 3, 0, 2]  # longest first, ties in the data's order
    picked = longest_samples(dataset, 6, 2)
    assert sample_lengths(picked) == [7, 7, 7, 7, 7, 7]

    def unread(_: object) -> None:
        raise AssertionError("a probe read the lengths again")

    monkeypatch.setattr("autotune.hf.job.sample_lengths", unread)
    handed = longest_samples(dataset, 6, 2, known)
    assert list(handed["input_ids"]) == [[1] * 7] * 6
    assert len(longest_samples(dataset, 4, 3, known)) == 4  # the batch's longest, cycled
