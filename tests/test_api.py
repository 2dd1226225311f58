"""The Python API: `autotune.search` runs the CLI's search path, `autotune.load` reads a
study's tuned arguments back; bad input is the CLI's one-line error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import PLAIN_LEVERS, TINY_GPT2, write_model

import autotune
from autotune.core.errors import UsageError


@pytest.mark.slow
def test_search_from_python_exports_what_load_gives_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    model = write_model(tmp_path / "tiny", TINY_GPT2)
    levers = [v for v in PLAIN_LEVERS if v != "--lever"]
    outcome = autotune.search(
        str(model),
        memory_budget="4GiB",
        time_budget="5m",
        device="cpu",
        lever=levers,
        global_batch_size=8,
        seq_len=32,
        precisions="fp32",
        optimizers=["adamw_torch"],
        checkpointing="off",
        max_trials=1,
        warmup_steps=1,
        measure_steps=2,
        confirm_top=0,
        quiet=True,
    )
    assert outcome.study_name == "tiny" and outcome.probes_this_run == 1
    assert outcome.output == Path("studies/tiny.best.json")
    exported = json.loads(outcome.output.read_text())
    assert exported["per_device_train_batch_size"] == 8
    loaded = autotune.load("tiny")
    assert loaded["per_device_train_batch_size"] == 8 and loaded["optim"] == "adamw_torch"
    summary = json.loads(Path("studies/tiny.best.summary.json").read_text())
    assert summary["memory_budget_bytes"] == 4 * 2**30


def test_bad_input_is_the_clis_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"no option batch_size= \(did you mean global_batch"):
        autotune.search("tiny", batch_size=8)
    with pytest.raises(UsageError, match=r"memory_budget='8XB': "):
        autotune.search("tiny", memory_budget="8XB")


@pytest.mark.slow
def test_search_takes_a_factory_function_and_returns_the_users_arguments_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from job_script import BASE_ARGS, write_job
    from trl import SFTConfig

    script = write_job(tmp_path / "job")
    monkeypatch.chdir(script.parent)
    monkeypatch.syspath_prepend(str(script.parent))
    import job  # type: ignore[import-not-found]

    try:
        outcome = autotune.search(
            job.untyped,  # its class from the arguments object given
            base_args=SFTConfig(**BASE_ARGS, use_cpu=True),
            memory_budget="4GiB",
            time_budget="5m",
            device="cpu",
            precisions="fp32",
            optimizers="adamw_torch",
            checkpointing="off",
            max_trials=1,
            warmup_steps=1,
            measure_steps=2,
            confirm_top=0,
            parity="off",
            lever=["torch_compile=false"],
            quiet=True,
        )
    finally:
        sys.modules.pop("job", None)
    args = outcome.arguments()
    assert isinstance(args, SFTConfig) and args.max_length == 64
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 8
    assert outcome.study_name == "job" and autotune.load("job")["max_length"] == 64
    calls = (script.parent / "calls.log").read_text().splitlines()
    # the survey and the one probe, each in its own process (no rehearsal: the adapter's
    # checkpoint fits beside the training's peak)
    per_process = [line.split()[0] for line in calls]
    assert len(calls) == 2 and len(set(per_process)) == 2
