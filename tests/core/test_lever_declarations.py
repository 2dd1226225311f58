"""Each lever is one declaration: what reads it (the Candidate, describe, the family, the
CLI's help, the export's fields and lines, parity) follows from it."""

from __future__ import annotations

import dataclasses
import re

from conftest import ROOT

from autotune.cli import cli
from autotune.core.enums import DeviceKind
from autotune.core.levers import DECLARED, FSDP, PACKING, ZERO_STAGE, lever_help
from autotune.core.parity import changes
from autotune.core.trial import LEVERS, OUTSIDE_FAMILY, Candidate
from autotune.hf.training_args import TUNED, tuned_arguments
from autotune.views.export import script_changes

PLAIN = Candidate(8, 2, "bf16", False, "adamw_torch")
SET = {
    "torch_compile": True,
    "attn_implementation": "eager",
    "use_liger_kernel": True,
    "padding_free": True,
    "packing": True,
    "dataloader_num_workers": 2,
    "zero_stage": 3,
    "fsdp_mode": "full_shard",
}


def test_the_candidates_levers_are_the_declared_ones_at_their_plain_values() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(Candidate)}
    assert LEVERS == tuple(lever.name for lever in DECLARED) == tuple(SET)
    assert {lever.name: lever.plain for lever in DECLARED} == {n: fields[n] for n in LEVERS}
    assert list(PLAIN.levers) == []


def test_a_lever_set_is_named_by_its_label_and_runs_what_it_declares() -> None:
    for lever in DECLARED:
        candidate = dataclasses.replace(PLAIN, **{lever.name: SET[lever.name]})
        assert candidate.describe() == PLAIN.describe() + " " + lever.label(SET[lever.name])
        fields = tuned_arguments(candidate, device_kind=DeviceKind.CUDA)
        plain = tuned_arguments(PLAIN, device_kind=DeviceKind.CUDA)
        added = {k: v for k, v in fields.items() if plain.get(k) != v}
        assert added == lever.fields(SET[lever.name])
        assert candidate.model_arguments() == lever.model_arguments(SET[lever.name])
        assert script_changes(candidate) == lever.script_lines(SET[lever.name])
        assert set(lever.owns) <= TUNED


def test_what_a_candidate_does_is_what_its_levers_declare() -> None:
    assert (
        PLAIN.levers.compiles,
        PLAIN.levers.flattens_batches,
        PLAIN.levers.shard_stage,
        PLAIN.levers.engine,
    ) == (
        False,
        False,
        0,
        "",
    )
    for lever in DECLARED:
        value = SET[lever.name]
        candidate = dataclasses.replace(PLAIN, **{lever.name: value})
        assert candidate.levers.compiles == lever.compiles
        assert candidate.levers.flattens_batches == lever.flattens_batches
        assert candidate.levers.shard_stage == lever.shard_stage(value)
        assert candidate.levers.engine == lever.engine
    assert [lever.name for lever in DECLARED if lever.compiles] == ["torch_compile"]
    assert [lever.name for lever in DECLARED if lever.flattens_batches] == [
        "padding_free",
        "packing",
    ]
    assert [lever.name for lever in DECLARED if lever.changes_samples] == ["packing"]
    for lever in DECLARED:
        candidate = dataclasses.replace(PLAIN, **{lever.name: SET[lever.name]})
        assert candidate.levers.changes_samples == lever.changes_samples
        assert candidate.keeping_samples() == (PLAIN if lever.changes_samples else candidate)
    assert dataclasses.replace(PLAIN, zero_stage=2).levers.shard_stage == 2


def test_a_levers_name_is_written_only_where_it_is_declared_held_and_offered() -> None:
    """The rest of autotune asks a Candidate what its levers do (compiles, flattens its
    batches, shards its state, which engine runs it), never for a lever by name."""
    # the job's survey reads the user's own setting of a name (their SFTConfig's packing)
    survey = {ROOT / "autotune/hf/job.py", ROOT / "autotune/core/job.py"}
    sources = {
        path: "\n".join(line for line in path.read_text().splitlines() if "#" not in line)
        for path in (ROOT / "autotune").rglob("*.py")
        if path not in survey
    }
    for lever in DECLARED:
        named = re.compile(rf"\b{lever.name}\b")
        holders = sorted(
            str(p.relative_to(ROOT)) for p, text in sources.items() if named.search(text)
        )
        assert len(holders) <= 3, f"{lever.name} is named in {holders}"


def test_only_a_lever_that_leaves_memory_alone_is_outside_the_family() -> None:
    assert {lever.name for lever in DECLARED if not lever.in_family} == {"dataloader_num_workers"}
    assert "dataloader_num_workers" in OUTSIDE_FAMILY and "zero_stage" not in OUTSIDE_FAMILY


def test_only_a_lever_that_may_change_the_sums_is_a_change_of_arithmetic() -> None:
    for lever in DECLARED:
        candidate = dataclasses.replace(PLAIN, **{lever.name: SET[lever.name]})
        (change,) = changes(candidate, PLAIN)
        # ZeRO in bf16: DeepSpeed does the mixed precision, not the Trainer's autocast;
        # FSDP in bf16: its policy computes and reduces in 16 bits; packed rows train
        # several samples a step, not the recipe's
        assert change.keeps_arithmetic == (lever not in (ZERO_STAGE, FSDP, PACKING))
    # in 32 bits FSDP's sums are DDP's
    full = dataclasses.replace(PLAIN, precision="fp32")
    (change,) = changes(dataclasses.replace(full, fsdp_mode="full_shard"), full)
    assert change.keeps_arithmetic


def test_levers_that_cannot_run_together_make_no_run() -> None:
    both = dataclasses.replace(PLAIN, zero_stage=2, fsdp_mode="full_shard")
    assert both.levers.clash == "fsdp_mode cannot run beside zero_stage"
    assert not dataclasses.replace(PLAIN, fsdp_mode="full_shard").levers.clash
    assert not PLAIN.levers.clash


def test_the_lever_option_lists_each_declared_lever_and_when_it_is_offered() -> None:
    (option,) = [p for p in cli.commands["search"].params if p.name == "levers"]
    assert option.help == lever_help()
    for lever in DECLARED:
        assert f"{lever.name} ({lever.offered_when})" in lever_help()
