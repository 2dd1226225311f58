"""The plan from options: what it takes from a default is said, with how to set it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from helpers import SPEC

from autotune.tuning.options import SearchOptions
from autotune.tuning.plan import workload_defaults

OPTIONS = SearchOptions(model="tiny", device="cpu")


def test_a_defaulted_global_batch_and_length_are_said_with_how_to_set_them() -> None:
    notes = workload_defaults(OPTIONS, SPEC)
    assert notes[0].startswith("global batch 64: a default; set --global-batch-size")
    assert notes[1].startswith("sequence length 128: a default") and "--seq-len" in notes[1]
    assert len(notes) == 2  # a causal LM has no target length
    given = dataclasses.replace(OPTIONS, global_batch_size=64, seq_len=128)
    assert workload_defaults(given, SPEC) == []
    seq2seq = dataclasses.replace(SPEC, model=dataclasses.replace(SPEC.model, task="seq2seq"))
    assert workload_defaults(given, seq2seq) == ["target length 32: a default; set --target-len"]


def test_what_base_args_set_is_not_a_default(tmp_path: Path) -> None:
    base = tmp_path / "args.json"
    fields = {"output_dir": "out", "per_device_train_batch_size": 8}
    base.write_text(json.dumps({**fields, "gradient_accumulation_steps": 8}))
    notes = workload_defaults(dataclasses.replace(OPTIONS, base_args=base), SPEC)
    assert [n.split(":")[0] for n in notes] == ["sequence length 128"]
