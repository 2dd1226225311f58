"""The jobs users bring, searched through the real CLI on this CPU: QLoRA (a bf16
checkpoint loaded in 4-bit NF4, prepared for k-bit training, LoRA on every linear layer,
TRL's SFTTrainer), the same job on its bf16 checkpoint, and a job run on two processes.
What a probe ran is what it is called, and the export trains in the user's own script
under the same budget."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import autotune
from job_script import BASE_ARGS, write_job

pytestmark = pytest.mark.slow

BUDGET = "2GiB"
QUICK = [
    "--device",
    "cpu",
    "--memory-budget",
    BUDGET,
    "--lever",
    "torch_compile=false",
    "--warmup-steps",
    "1",
    "--measure-steps",
    "2",
    "--confirm-top",
    "0",
    "--parity",
    "off",
    "--no-reuse",
]
# QLoRA as its guides write it: 8 x 2, bf16 autocast and a paged 8-bit AdamW
QLORA_ARGS = {
    **BASE_ARGS,
    "per_device_train_batch_size": 8,
    "bf16": True,
    "optim": "paged_adamw_8bit",
}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    script = write_job(tmp_path_factory.mktemp("jobs"))
    (script.parent / "qlora.json").write_text(json.dumps(QLORA_ARGS))
    return script


def _show(folder: Path, study: str) -> list[dict[str, object]]:
    shown = autotune(folder, "show", "--study", study, "--format", "json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    return list(json.loads(shown.stdout)["trials"])


def _copy(job: Path, folder: Path) -> Path:
    """The job's script, model and data in a folder of this test's (no studies)."""
    shutil.copytree(job.parent, folder, ignore=shutil.ignore_patterns("studies", "runs"))
    return folder


def _load_in_bf16(folder: Path) -> None:
    """Edit the script's QLoRA factory to load the checkpoint as stored, in bf16."""
    script = folder / "job.py"
    script.write_text(script.read_text().replace("BITS = 4", "BITS = 16"))


def _train_in_their_script(folder: Path, factory: str, exported: Path, budget: int) -> None:
    """Their script, reading the export with HfArgumentParser, trains a few steps in a
    process of its own under RLIMIT_DATA at the search's budget, Arrow's pool off."""
    code = textwrap.dedent(
        f"""
        import resource, sys
        sys.path.insert(0, {str(folder)!r})
        from transformers import HfArgumentParser
        from trl import SFTConfig
        import job
        (args,) = HfArgumentParser(SFTConfig).parse_json_file({str(exported)!r})
        args.max_steps, args.output_dir = 3, {str(folder / "runs")!r}
        resource.setrlimit(resource.RLIMIT_DATA, ({budget}, {budget}))
        print("steps", job.{factory}(args).train().global_step)
        """
    )
    env = {"HF_HUB_OFFLINE": "1", "ARROW_DEFAULT_MEMORY_POOL": "system", "PATH": "/usr/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "steps 3" in done.stdout, done.stderr[-3000:]


def test_a_qlora_job_is_called_what_it_runs_and_its_export_trains_in_their_script(
    job: Path,
) -> None:
    done = autotune(
        job.parent,
        "search",
        "--trainer",
        "job.py:qlora",
        "--base-args",
        "qlora.json",
        *QUICK,
        "--max-trials",
        "3",
        "--study",
        "qlora",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trials = _show(job.parent, "qlora")
    configs = [str(t["config"]) for t in trials]
    # TRL trains a 4-bit model's adapters in bf16: without autocast that is not fp32; and
    # prepare_model_for_kbit_training checkpoints every probe, whatever a config says
    assert not any(" fp32 " in c or "no-ckpt" in c for c in configs), configs
    assert any(" as-loaded " in c for c in configs), configs
    assert "checkpointing off: your factory turns it on itself" in done.stdout
    # their recipe, probed as it is: bf16 autocast and their paged 8-bit AdamW
    ran = {(t["training_arguments"]["optim"], t["outcome"]) for t in trials}  # type: ignore[index]
    assert ("paged_adamw_8bit", "ok") in ran, ran
    for t in trials:  # the estimate models a 4-bit base: a figure beside every peak
        assert t["predicted_peak_gib"] and t["peak_memory_gib"], t
    exported = job.parent / "studies" / "qlora.best.json"
    assert json.loads(exported.read_text())["activation_checkpointing"] is True
    _train_in_their_script(job.parent, "qlora", exported, 2 * 2**30)


def test_a_lora_job_on_a_bf16_checkpoint_is_estimated_as_held_and_not_called_fp32(
    job: Path, tmp_path: Path
) -> None:
    folder = _copy(job, tmp_path / "bf16")
    _load_in_bf16(folder)
    done = autotune(
        folder,
        "search",
        "--trainer",
        "job.py:qlora",
        "--base-args",
        "qlora.json",
        *QUICK,
        "--max-trials",
        "3",
        "--study",
        "lora-bf16",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trials = _show(folder, "lora-bf16")
    assert not any(" fp32 " in str(t["config"]) for t in trials)
    for t in trials:  # predicted and measured peaks, within 30% of each other
        predicted, measured = float(t["predicted_peak_gib"]), float(t["peak_memory_gib"])  # type: ignore[arg-type]
        assert abs(predicted - measured) <= 0.3 * measured, t
    _train_in_their_script(folder, "qlora", folder / "studies" / "lora-bf16.best.json", 2**31)


def test_a_factory_edited_from_4bit_to_bf16_is_another_search(job: Path, tmp_path: Path) -> None:
    folder = _copy(job, tmp_path / "edited")
    argv = ["search", "--trainer", "job.py:qlora", "--base-args", "qlora.json", *QUICK]
    first = autotune(folder, *argv, "--max-trials", "1", "--study", "mine")
    assert first.returncode == 0, first.stderr[-3000:]
    _load_in_bf16(folder)
    again = autotune(folder, *argv, "--max-trials", "1", "--study", "mine")
    assert again.returncode != 0  # not a resume with the 4-bit job's peaks
    last = again.stderr.strip().splitlines()[-1]
    assert "already holds a different search (job." in last, last  # it names what changed
    assert "job.held: {'frozen 4-bit nf4'" in last, last


def test_two_processes_keep_the_users_global_batch_and_arithmetic(job: Path) -> None:
    """Over two processes (gloo) the global batch counts both; and a change of the
    recipe's precision or optimizer read in probes alone, no paired rounds run
    (--confirm-rounds 0), is not exported, whatever it read (one such probe once
    exported bf16 Adafactor for 1.33x, which its confirmation would not have shown)."""
    (job.parent / "sixteen.json").write_text(
        json.dumps(
            {**BASE_ARGS, "per_device_train_batch_size": 16, "gradient_accumulation_steps": 1}
        )
    )
    done = autotune(
        job.parent,
        "search",
        "--trainer",
        "job.py:make_trainer",
        "--base-args",
        "sixteen.json",
        *QUICK,
        "--nproc-per-node",
        "2",
        "--precisions",
        "fp32,bf16",
        "--optimizers",
        "adamw_torch,adafactor",
        "--checkpointing",
        "off",
        "--max-trials",
        "2",
        "--study",
        "two",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "global batch 32 over 2 processes" in done.stdout
    assert "(probe 2 of 2" in done.stdout  # a second config was probed beside the recipe
    args = json.loads((job.parent / "studies" / "two.best.json").read_text())
    # per device x accumulation x 2 processes: their 16 x 1 x 2, not half of it
    assert args["per_device_train_batch_size"] * args["gradient_accumulation_steps"] == 16
    assert args.get("bf16") is not True and args["optim"] == "adamw_torch"
    summary = json.loads((job.parent / "studies" / "two.best.summary.json").read_text())
    assert summary["parity"]["alters_arithmetic"] == [], summary["parity"]
