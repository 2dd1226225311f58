"""The plan from options: what it takes from a default is said, with how to set it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from helpers import SPEC

from autotune.search.plan import SpecOptions, workload_defaults

OPTIONS = SpecOptions(
    model="tiny", task="auto", device="cpu", memory_budget=None, headroom=0.05,
    global_batch_size=None, seq_len=None, target_len=None, base_args=None, precisions=None,
    optimizers=None, checkpointing=None, warmup_steps=3, measure_steps=5, seed=0,
)  # fmt: skip


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
    base.write_text(json.dumps({"output_dir": "out", "per_device_train_batch_size": 8,
                                "gradient_accumulation_steps": 8}))  # fmt: skip
    notes = workload_defaults(dataclasses.replace(OPTIONS, base_args=base), SPEC)
    assert [n.split(":")[0] for n in notes] == ["sequence length 128"]
