"""The plan from the resolved facts and the options: what it takes from a default is
said, with how to set it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from helpers import SPEC

from autotune.core.checkpointing import Checkpointing
from autotune.core.device import DeviceInfo
from autotune.core.enums import DeviceKind
from autotune.core.errors import UsageError
from autotune.core.job import BaseArguments, JobFacts, ParameterCount
from autotune.core.recipe import Recipe
from autotune.core.trial import ModelSpec
from autotune.tuning.options import SearchOptions
from autotune.tuning.plan import Layout, _graded, plan, workload_defaults
from autotune.tuning.resolve import Facts, default_optim, read_base

OPTIONS = SearchOptions(model="tiny", device="cpu")
NO_FILE = BaseArguments(None, None, None, {})


def test_a_defaulted_global_batch_and_length_are_said_with_how_to_set_them() -> None:
    notes = workload_defaults(OPTIONS.workload, SPEC, NO_FILE)
    assert notes[0].startswith("global batch 64: a default; set --global-batch-size")
    assert notes[1].startswith("sequence length 128: a default") and "--seq-len" in notes[1]
    assert len(notes) == 2  # a causal LM has no target length
    given = dataclasses.replace(OPTIONS, global_batch_size=64, seq_len=128)
    assert workload_defaults(given.workload, SPEC, NO_FILE) == []
    seq2seq = dataclasses.replace(SPEC, model=dataclasses.replace(SPEC.model, task="seq2seq"))
    assert workload_defaults(given.workload, seq2seq, NO_FILE) == [
        "target length 32: a default; set --target-len"
    ]


def test_what_base_args_set_is_not_a_default(tmp_path: Path) -> None:
    base = tmp_path / "args.json"
    fields = {"output_dir": "out", "per_device_train_batch_size": 8}
    base.write_text(json.dumps({**fields, "gradient_accumulation_steps": 8}))
    notes = workload_defaults(
        dataclasses.replace(OPTIONS, base_args=base).workload, SPEC, read_base(base, None)
    )
    assert [n.split(":")[0] for n in notes] == ["sequence length 128"]


def test_the_checkpointing_levels_are_those_offered_and_asked_for() -> None:
    """A 2-layer model on the CPU: off, every 2nd, every layer; asking for a level it is
    not offered says why, in one line; a job that turns checkpointing on itself is never
    run without it."""
    space = SPEC.space
    levels = _graded(space, None, 2, DeviceKind.CPU, None).checkpointing
    assert levels == (Checkpointing.OFF, Checkpointing.EVERY_2, Checkpointing.ON)
    narrowed = _graded(space, ("on", "every-2"), 2, DeviceKind.CPU, None)
    assert narrowed.checkpointing == (Checkpointing.EVERY_2, Checkpointing.ON)
    assert "checkpointing offload" in dict(narrowed.not_offered)
    with pytest.raises(UsageError, match="--checkpointing every-4: the model has 2 layers"):
        _graded(space, ("every-4",), 2, DeviceKind.CPU, None)
    with pytest.raises(UsageError, match="choose from off, every-4, every-2, on, offload"):
        _graded(space, ("sometimes",), 2, DeviceKind.CPU, None)
    forced = JobFacts.from_json(json.dumps({**_job(), "forced_checkpointing": True}))
    on_gpu = _graded(space, None, 8, DeviceKind.CUDA, forced).checkpointing
    assert Checkpointing.OFF not in on_gpu and Checkpointing.OFFLOAD in on_gpu
    both = _graded(space, ("on", "off"), 8, DeviceKind.CPU, forced)  # off: never, said why
    assert both.checkpointing == (Checkpointing.ON,)


def _job() -> dict[str, object]:
    fields = ("args_class", "model_name", "model_class", "task", "config")
    return {name: "" for name in fields} | {
        "config": {},
        "parameters": 1,
        "trainable": 1,
        "embedding": 0,
        "largest": 1,
    }


def _facts(**changes: object) -> Facts:
    """A job resolved by hand: what tuning/resolve.py would read, with no hf call."""
    facts = Facts(
        device=DeviceInfo("cpu", None, "test cpu", 16 * 2**30),
        model=ModelSpec("tiny", "local", "causal-lm", {"num_hidden_layers": 2}),
        job=None,
        base=NO_FILE,
        counted=ParameterCount(total=10**6, embedding=10**5, largest=10**5, checkpoint_layers=2),
        max_positions=256,
        installed_optimizers=("adamw_torch", "adamw_torch_fused", "adafactor"),
        levers=(),
        levers_not_offered=(("torch_compile", "no compiler"),),
        checkpointing_field="activation_checkpointing",
        gpus=0,
    )
    return dataclasses.replace(facts, **changes)  # type: ignore[arg-type]


def test_the_plan_is_derived_from_the_resolved_facts_alone() -> None:
    """plan() reads typed facts, never hf: the space, the lengths and the budget follow
    from them, and what they say is not offered is said."""
    spec, slots = plan(OPTIONS, _facts(), Layout(), with_dataset=False)
    assert slots == [] and spec.global_batch_size == 32
    assert spec.space.optimizers == ("adamw_torch", "adamw_torch_fused", "adafactor")
    assert spec.space.checkpointing == (Checkpointing.OFF, Checkpointing.EVERY_2, Checkpointing.ON)
    assert dict(spec.space.not_offered)["torch_compile"] == "no compiler"
    assert spec.seq_len == 256 and spec.parameters == 10**6
    with pytest.raises(UsageError, match="exceeds tiny's limit of 256"):
        plan(dataclasses.replace(OPTIONS, seq_len=512), _facts(), Layout(), with_dataset=False)


def test_the_users_global_batch_counts_every_process() -> None:
    """Their 16 x 1 per device over 2 processes is a global batch of 32, as torchrun runs
    it: each process takes 16."""
    theirs = BaseArguments(16, None, None, {})
    spec, _ = plan(OPTIONS, _facts(base=theirs), Layout(nproc_per_node=2), with_dataset=False)
    assert spec.global_batch_size == 32 and spec.space.global_batch_size == 16


def test_a_recipe_silent_on_the_optimizer_trains_the_classs_default() -> None:
    """Their file sets bf16 and no optim: their run trains what TrainingArguments
    defaults to in the installed transformers (the fused AdamW from torch 2.8), so that
    is the recipe the headline and the first guesses weigh, read from the class. A
    search without a recipe stays without one (the plain default is the baseline)."""
    import transformers

    default = next(
        f.default for f in dataclasses.fields(transformers.TrainingArguments) if f.name == "optim"
    )
    assert default_optim("") == str(getattr(default, "value", default))
    theirs = BaseArguments(32, None, None, {}, recipe={"bf16": True})
    facts = _facts(base=theirs, default_optim="adamw_torch_fused")
    spec, _ = plan(OPTIONS, facts, Layout(), with_dataset=False)
    assert spec.recipe.optim == "adamw_torch_fused" and spec.recipe.given
    named = BaseArguments(32, None, None, {}, recipe={"bf16": True, "optim": "adafactor"})
    assert _facts(base=named, default_optim="adamw_torch_fused").recipe["optim"] == "adafactor"
    spec, _ = plan(OPTIONS, _facts(default_optim="adamw_torch_fused"), Layout(), with_dataset=False)
    assert not spec.recipe.given and spec.recipe_settings == {}


def test_a_study_stored_before_the_class_default_was_read_keeps_plain_adamw() -> None:
    """Studies planned earlier hold no optim where the file was silent: they meant the
    plain AdamW, and still do."""
    assert Recipe({"bf16": True}).optim == "adamw_torch"
    assert Recipe({"bf16": True}).precision == "bf16"
    assert Recipe({"per_device_train_batch_size": True}).micro_batch is None
