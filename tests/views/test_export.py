from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from helpers import SPEC, cand, rec
from transformers import HfArgumentParser, TrainingArguments

from autotune.core.device import DeviceInfo
from autotune.core.enums import DeviceKind, Objective, Outcome, Precision, Task
from autotune.core.errors import ExportError
from autotune.hf.training_args import validate
from autotune.views.export import export_best, launch_line, sidecar_path, srun_line


def test_export_round_trips_through_hf_argument_parser(tmp_path: Path) -> None:
    best = rec(3, cand(16, "bf16", ckpt=True), sps=12.0, peak_gib=2.0)
    out = export_best(
        record=best,
        spec=SPEC,
        study_name="s",
        output=tmp_path / "best.json",
        runners_up=[],
        objective=Objective.THROUGHPUT,
        validate=True,
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


def test_validate_refuses_what_trainingarguments_refuses() -> None:
    with pytest.raises(ExportError, match="refuses"):
        validate({"tf32": True, "use_cpu": True}, error=ExportError, where="x")


def test_export_refuses_a_config_trainingarguments_refuses_on_this_machine(
    tmp_path: Path,
) -> None:
    cuda_spec = dataclasses.replace(
        SPEC, device=DeviceInfo(DeviceKind.CUDA, 0, "A100", 80 * 2**30, (8, 0))
    )
    with pytest.raises(ExportError, match="refuses"):
        export_best(
            record=rec(1, cand(8, "bf16"), sps=1.0, peak_gib=1.0),
            spec=cuda_spec,
            study_name="s",
            output=tmp_path / "b.json",
            runners_up=[],
            objective=Objective.THROUGHPUT,
            validate=True,
        )
    assert not (tmp_path / "b.json").exists()  # nothing half-written


def test_the_tuned_fields_are_derived_from_the_one_mapping() -> None:
    """A base-args or merge value can never override a searched field: every field the
    mapping sets, on any device and under either checkpointing name, is in TUNED."""
    from autotune.core.trial import Candidate
    from autotune.hf.training_args import CHECKPOINTING_FIELDS, TUNED, merge, tuned_arguments

    grouped = Candidate(8, 8, "bf16", True, "adafactor", "group_by_length")
    for kind in DeviceKind:
        for field in CHECKPOINTING_FIELDS:
            assert (
                set(tuned_arguments(grouped, device_kind=kind, checkpointing_field=field)) <= TUNED
            )
    assert "train_sampling_strategy" in TUNED
    tuned = tuned_arguments(grouped, device_kind=DeviceKind.CPU)
    merged = merge(
        {
            "train_sampling_strategy": "sequential",
            "gradient_checkpointing": False,
            "learning_rate": 1e-4,
        },
        tuned,
    )
    assert merged["train_sampling_strategy"] == "group_by_length"
    assert "gradient_checkpointing" not in merged and merged["learning_rate"] == 1e-4


def test_a_levered_config_exports_what_the_script_needs_and_parses(tmp_path: Path) -> None:
    """Compilation, liger and loader workers are TrainingArguments fields; the attention
    implementation and padding-free batches are not: the sidecar and the hand-off say
    how the script sets them."""
    from autotune.core.trial import Candidate
    from autotune.hf.training_args import TUNED, tuned_arguments

    plain = tuned_arguments(
        Candidate(8, 8, "fp32", False, "adamw_torch"), device_kind=DeviceKind.CPU
    )
    assert "torch_compile" not in plain and "dataloader_num_workers" not in plain
    levered = dataclasses.replace(
        cand(16, "bf16"),
        torch_compile=True,
        attn_implementation="eager",
        padding_free=True,
        dataloader_num_workers=1,
    )
    assert {"torch_compile", "use_liger_kernel", "dataloader_num_workers"} <= TUNED
    out = export_best(
        record=rec(2, levered, sps=20.0),
        spec=SPEC,
        study_name="s",
        output=tmp_path / "best.json",
        runners_up=[],
        objective=Objective.THROUGHPUT,
        validate=True,
    )
    (args,) = HfArgumentParser(TrainingArguments).parse_json_file(str(out))
    assert args.torch_compile and args.dataloader_num_workers == 1
    summary = json.loads(sidecar_path(out).read_text())
    assert summary["model_arguments"] == {"attn_implementation": "eager"}
    assert any("DataCollatorWithFlattening" in line for line in summary["script_changes"])
    assert any('attn_implementation="eager"' in line for line in summary["script_changes"])
    kept = summary["parity"]["keeps_arithmetic"]
    assert any("torch_compile" in change for change in kept)  # the same sums, compiled
    assert summary["parity"]["alters_arithmetic"] == ["precision fp32 -> bf16"]


def test_the_users_max_steps_is_the_run_length_selection_weighs() -> None:
    from autotune.hf.training_args import base_arguments

    assert base_arguments({"max_steps": 1000}).train_steps == 1000
    assert base_arguments({"max_steps": -1}).train_steps is None  # Trainer: run the epochs
    assert base_arguments({}).train_steps is None


def test_an_exported_packed_config_says_the_run_length_that_trains_their_samples() -> None:
    """Packed rows train several samples a step: the user's max_steps would train more
    of them, and the export says how many steps train as many as their recipe's."""
    from autotune.views.export import run_changes

    spec = dataclasses.replace(SPEC, kept_arguments={"max_steps": 300})
    packed = rec(1, dataclasses.replace(cand(8), packing=True))
    packed = dataclasses.replace(packed, result=packed.result.replace(samples_per_step=256.0))
    (line,) = run_changes(packed, spec)
    assert line.startswith("packed rows: a step trains about 256 of your samples, 64 a step")
    assert "your max_steps 300 would train 4.0x the samples, max_steps 75 as many" in line
    assert run_changes(rec(0, cand(8)), spec) == []


@pytest.mark.parametrize(
    ("share", "slowdown", "told"),
    [(0.08, 177.0, True), (0.08, 1.1, False), (0.001, 177.0, False), (None, None, False)],
)
def test_a_job_making_subnormal_numbers_on_a_cpu_that_pays_is_told_to_flush_them(
    share: float | None, slowdown: float | None, told: bool
) -> None:
    """Only where the probe found the job making them (a share of its optimizer's state)
    and this CPU slow on them; a stand-in's are its random weights', which the user's
    checkpoint may not share, and the line says so only for a stand-in."""
    from autotune.views.export import run_changes

    record = rec(0, cand(8))
    record = dataclasses.replace(
        record, result=record.result.replace(subnormal_share=share, subnormal_slowdown=slowdown)
    )
    lines = run_changes(record, SPEC)
    assert bool(lines) == told
    if not told:
        return
    (line,) = lines
    assert line.startswith("torch.set_flush_denormal(True) at its start: 8% of the")
    assert "177.0x slower" in line and "the stand-in's random weights made them" in line
    theirs = dataclasses.replace(SPEC.model, source="factory", trainer="train.py:make_trainer")
    (line,) = run_changes(record, dataclasses.replace(SPEC, model=theirs))
    assert "set_flush_denormal" in line and "stand-in" not in line


def test_a_kept_recipe_says_the_faster_change_it_passed_over_under_nothing_changed() -> None:
    """The search exports the user's own recipe, a bf16 probe 1.15x faster in separate
    runs not counting as a gain for an unchecked change: the lines against their recipe
    say nothing changed, then why, in one line."""
    from autotune.views.export import parity_summary
    from autotune.views.summary import change_lines

    spec = dataclasses.replace(SPEC, recipe_settings={"per_device_train_batch_size": 8})
    yours = rec(0, cand(8), sps=10.0, peak_gib=2.0)
    faster = rec(1, dataclasses.replace(cand(8), precision="bf16"), sps=11.5, peak_gib=2.0)
    lines = change_lines(parity_summary(yours, spec, [yours, faster], None))
    assert lines[1:3] == [
        "  nothing changed",
        "  kept your arithmetic: trial 1 (batch 8x8 bf16 no-ckpt adamw_torch) read 1.15x (1.15-"
        "1.15x over their step times) its speed in separate runs, a gain not confirmed in "
        "paired rounds for its change (precision fp32 -> bf16), which parity left "
        "unchecked; --parity on or a longer --time-budget can settle it",
    ]


def test_their_tf32_is_carried_from_their_file_through_the_plan_into_the_export(
    tmp_path: Path,
) -> None:
    """Their --base-args turn TF32 on: read into the plan's recipe, it stays on in the
    export of a bf16 config on CUDA (the matmuls bf16 leaves in 32 bits), and an fp32
    config, which means full fp32 matmuls, turns it off."""
    from autotune.core.checkpointing import Checkpointing
    from autotune.core.job import ParameterCount
    from autotune.core.trial import Candidate, ModelSpec
    from autotune.tuning.options import SearchOptions
    from autotune.tuning.plan import Layout, plan
    from autotune.tuning.resolve import Facts, read_base

    theirs = tmp_path / "args.json"
    theirs.write_text(json.dumps({"output_dir": "out", "tf32": True, "learning_rate": 1e-4}))
    facts = Facts(
        device=DeviceInfo(DeviceKind.CUDA, 0, "A100", 80 * 2**30, (8, 0)),
        model=ModelSpec("tiny", "local", Task.CAUSAL_LM, {"num_hidden_layers": 2}),
        job=None,
        base=read_base(theirs, None),
        counted=ParameterCount(total=10**6, embedding=10**5, largest=10**5, checkpoint_layers=2),
        max_positions=256,
        installed_optimizers=("adamw_torch",),
        levers=(),
        levers_not_offered=(),
        checkpointing_field="activation_checkpointing",
        gpus=1,
    )
    options = SearchOptions(model="tiny", device="cuda", global_batch_size=16, base_args=theirs)
    spec, _ = plan(options, facts, Layout(), with_dataset=False)

    def exported(precision: Precision) -> dict[str, object]:
        candidate = Candidate(8, 2, precision, Checkpointing.OFF, "adamw_torch")
        out = export_best(
            record=rec(1, candidate, sps=2.0, peak_gib=1.0),
            spec=spec,
            study_name="s",
            output=tmp_path / f"{precision}.json",
            runners_up=[],
            objective=Objective.THROUGHPUT,
            validate=False,  # TrainingArguments refuses tf32 on a machine without CUDA
        )
        return dict(json.loads(out.read_text()))

    bf16 = exported(Precision.BF16)
    assert bf16["tf32"] is True and bf16["bf16"] is True and bf16["learning_rate"] == 1e-4
    assert exported(Precision.FP32)["tf32"] is False


def test_the_launch_line_is_the_one_the_probes_ran_under() -> None:
    """One process, DDP on one node, or every node's torchrun through the c10d rendezvous
    (and the same under Slurm, the job's first node hosting it)."""
    assert launch_line(1) == "python your_script.py ARGS.json"
    assert launch_line(4) == "torchrun --nproc-per-node 4 your_script.py ARGS.json"
    across = launch_line(8, 2)
    assert across.startswith("torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d ")
    assert "--rdzv-endpoint HEAD_ADDR:29400" in across
    slurm = srun_line(8, 2)
    assert slurm.startswith("srun --nodes 2 --ntasks-per-node 1 bash -c 'torchrun --nnodes 2")
    assert "$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1):29400" in slurm


def test_an_unchecked_parity_says_why_rather_than_blaming_parity_off() -> None:
    """A search with parity on exported bf16 where no fp32 config fit, and said "searched
    with --parity off": there was no probe of the recipe's arithmetic to compare with.
    Each reason a verdict is missing is said as it is."""
    from autotune.core.parity_state import ParityState
    from autotune.views.export import NOT_CHECKED, parity_summary

    state = ParityState(cand(8), 0, 1e-3)
    oom = rec(0, cand(8), Outcome.OOM, peak_gib=9.0)
    bf16 = rec(1, cand(8, "bf16"), sps=30.0, peak_gib=2.0)
    verdict = parity_summary(bf16, SPEC, [oom, bf16], state)["verdict"]
    assert verdict == (
        "training parity not checked: no config of your recipe's arithmetic (fp32, "
        "adamw_torch) fit, so none ran to compare with"
    )
    fits = rec(2, cand(8, ckpt=True), sps=10.0, peak_gib=3.0)
    verdict = parity_summary(bf16, SPEC, [oom, bf16, fits], state)["verdict"]
    assert verdict == (
        "training parity not checked: this search judged no probe or run of its "
        "arithmetic against your recipe's"
    )
    assert parity_summary(bf16, SPEC, [oom, bf16], None)["verdict"] == NOT_CHECKED
