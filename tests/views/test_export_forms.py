"""The three ways a result reaches the user's script: JSON, flags, merge; and --base-args."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PLAIN_LEVERS, ROOT, autotune
from transformers import HfArgumentParser, TrainingArguments

pytestmark = pytest.mark.slow
Study = tuple[Path, list[str], str]

USER_ARGS = {
    "model_name_or_path": "./tiny",
    "output_dir": "my-run",
    "learning_rate": 3e-4,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 17,
    "per_device_train_batch_size": 32,
    "gradient_accumulation_steps": 1,
    "optim": "sgd",
    "num_train_epochs": 3,
}


def test_cli_flags_parse_with_hf_argument_parser(searched_study: Study) -> None:
    work, _, _ = searched_study
    done = autotune(work, "export", "--study", "tiny", "--format", "cli")
    assert done.returncode == 0, done.stderr
    flags = shlex.split(done.stdout)
    assert flags[:2] == ["--per_device_train_batch_size", "8"]
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(flags)
    exported = json.loads((work / "studies" / "tiny.best.json").read_text())
    for key, value in exported.items():
        assert getattr(args, key) == value


def test_merge_into_replaces_only_the_tuned_fields(searched_study: Study, tmp_path: Path) -> None:
    work, _, _ = searched_study
    mine = tmp_path / "my_args.json"
    mine.write_text(json.dumps(USER_ARGS, indent=2))
    done = autotune(work, "export", "--study", "tiny", "--merge-into", str(mine))
    assert done.returncode == 0, done.stderr
    assert "per_device_train_batch_size 32 -> 8" in done.stdout
    merged = json.loads(mine.read_text())
    tuned = json.loads((work / "studies" / "tiny.best.json").read_text())
    for key, value in USER_ARGS.items():
        if key not in tuned:
            assert merged[key] == value and type(merged[key]) is type(value)
    for key, value in tuned.items():
        assert merged[key] == value
    assert merged["per_device_train_batch_size"] * merged["gradient_accumulation_steps"] == 32
    training = {k: v for k, v in merged.items() if k != "model_name_or_path"}
    (args,) = HfArgumentParser(TrainingArguments).parse_dict(training)
    assert args.learning_rate == 3e-4 and args.lr_scheduler_type == "cosine"
    # The user's own script trains with the merged file, unchanged.
    trained = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "train_with_args.py"),
            str(mine),
            "--max_steps",
            "2",
            "--max_seq_length",
            "64",
            "--flush_denormal",  # as the export says where the CPU is slow on subnormals
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert trained.returncode == 0, trained.stderr[-2000:]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"per_device_train_batchsize": 8}', "did you mean 'per_device_train_batch_size'"),
        ('{"lr_scheduler_type": "sideways"}', "TrainingArguments refuses it"),
    ],
)
def test_bad_user_files_are_refused_and_left_alone(
    searched_study: Study, tmp_path: Path, content: str, message: str
) -> None:
    work, _, _ = searched_study
    mine = tmp_path / "my_args.json"
    mine.write_text(content)
    for argv in (
        ["export", "--study", "tiny", "--merge-into", str(mine)],
        ["search", "--model", "./tiny", "--base-args", str(mine), "--study", "other"],
    ):
        done = autotune(work, *argv)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert mine.read_text() == content


def test_base_args_fix_the_global_batch_and_carry_the_rest(tmp_path: Path) -> None:
    from conftest import TINY_GPT2, write_model

    write_model(tmp_path / "tiny", TINY_GPT2)
    base = {
        **USER_ARGS,
        "optim": "adamw_torch",
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4,
        "max_seq_length": 32,
        "max_grad_norm": 0.5,
    }
    (tmp_path / "base.json").write_text(json.dumps(base))
    done = autotune(
        tmp_path,
        "search",
        "--model",
        "./tiny",
        "--base-args",
        "base.json",
        "--device",
        "cpu",
        *PLAIN_LEVERS,
        "--precisions",
        "fp32",
        "--optimizers",
        "adamw_torch",
        "--checkpointing",
        "off",
        "--max-trials",
        "1",
        "--warmup-steps",
        "1",
        "--measure-steps",
        "2",
        "--confirm-top",
        "0",
        "--quiet",
    )
    assert done.returncode == 0, done.stderr
    assert "global batch 16; 32 tokens" in done.stdout
    exported = json.loads((tmp_path / "studies" / "tiny.best.json").read_text())
    assert exported["per_device_train_batch_size"] * exported["gradient_accumulation_steps"] == 16
    assert exported["max_grad_norm"] == 0.5 and exported["lr_scheduler_type"] == "cosine"
    # their run's own fields, which no probe runs, are written back as they were
    assert exported["output_dir"] == "my-run" and exported["num_train_epochs"] == 3
    assert "model_name_or_path" not in exported  # not a TrainingArguments field
    # the probe's own config (their recipe, at a fallback batch, was queued first and
    # skipped while 8 fits)
    probed = next((tmp_path / "studies/tiny/trials").glob("*/config.json"))
    config = json.loads(probed.read_text())
    assert config["training_arguments"]["learning_rate"] == 3e-4
    # What is exported is what the probe ran, field for field, beside the run's own
    # fields the sidecar names as yours
    summary = json.loads((tmp_path / "studies" / "tiny.best.summary.json").read_text())
    assert summary["your_arguments"] == {"output_dir": "my-run", "num_train_epochs": 3}
    ran = {k: v for k, v in exported.items() if k not in summary["your_arguments"]}
    assert {k: v for k, v in config["training_arguments"].items() if k in ran} == ran
    assert set(config["training_arguments"]) == set(ran)
