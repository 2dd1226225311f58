"""What a candidate's TrainingArguments fields make the user's own Trainer do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import HfArgumentParser, Trainer, TrainingArguments

from autotune.core.checkpointing import Checkpointing
from autotune.core.enums import DeviceKind
from autotune.core.trial import Candidate
from autotune.hf.models import build_model, checkpoint_layers, resolve_model
from autotune.hf.training_args import TUNED, tuned_arguments


@pytest.mark.parametrize(
    ("level", "flags"),
    [
        (Checkpointing.OFF, [False] * 4),
        (Checkpointing.EVERY_4, [True, False, False, False]),
        (Checkpointing.EVERY_2, [True, False, True, False]),
        (Checkpointing.ON, [True] * 4),
    ],
)
def test_an_exported_level_is_the_checkpointing_their_trainer_runs(
    level: Checkpointing, flags: list[bool], tmp_path: Path, tiny_gpt2: Path
) -> None:
    """Exported as JSON, read by HfArgumentParser, built into a Trainer: the layers it
    checkpoints are the level's (4 layers: every 4th is layer 0 alone)."""
    config = json.loads((tiny_gpt2 / "config.json").read_text()) | {"n_layer": 4}
    (tiny_gpt2 / "config.json").write_text(json.dumps(config))
    candidate = Candidate(8, 1, "fp32", level, "adamw_torch")
    fields = tuned_arguments(candidate, device_kind=DeviceKind.CPU)
    run = {"output_dir": str(tmp_path), "report_to": [], "max_steps": 1, "save_strategy": "no"}
    (args,) = HfArgumentParser(TrainingArguments).parse_dict(json.loads(json.dumps(fields)) | run)
    model = build_model(resolve_model(str(tiny_gpt2)))
    assert checkpoint_layers(model) == 4
    tokens = torch.arange(16)
    data = [{"input_ids": tokens, "labels": tokens} for _ in range(8)]
    Trainer(model=model, args=args, train_dataset=data).train()
    assert [block.gradient_checkpointing for block in model.transformer.h] == flags


def test_the_search_owns_the_checkpointing_kwargs_of_a_base_file() -> None:
    assert {"activation_checkpointing", "activation_checkpointing_kwargs"} <= TUNED
