from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import SPEC, cand, rec
from transformers import HfArgumentParser, TrainingArguments

from autotune.core.errors import ExportError
from autotune.views.export import export_best, sidecar_path, verify


def test_export_round_trips_through_hf_argument_parser(tmp_path: Path) -> None:
    best = rec(3, cand(16, "bf16", ckpt=True), sps=12.0, peak_gib=2.0)
    out = export_best(
        record=best,
        spec=SPEC,
        study_name="s",
        output=tmp_path / "best.json",
        runners_up=[],
        objective="throughput",
    )
    written = json.loads(out.read_text())
    (args,) = HfArgumentParser(TrainingArguments).parse_json_file(str(out))
    assert args.per_device_train_batch_size == 16
    assert args.gradient_accumulation_steps == 4
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 64
    assert args.bf16 and not args.fp16 and args.optim == "adamw_torch"
    assert args.activation_checkpointing is True
    # Only TrainingArguments fields: the figures live in the sidecar.
    fields = set(TrainingArguments.__dataclass_fields__)
    assert set(written) <= fields
    summary = json.loads(sidecar_path(out).read_text())
    assert summary["best"]["trial"] == 3 and summary["best"]["samples_per_s"] == 12.0
    assert summary["global_batch_size"] == 64


def test_verify_refuses_what_trainingarguments_refuses() -> None:
    with pytest.raises(ExportError, match="refuses"):
        verify({"tf32": True, "use_cpu": True})
