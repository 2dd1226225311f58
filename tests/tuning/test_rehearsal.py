"""The whole run survives: before the export, the selected config rehearses the run's
evaluation and checkpoint save under the same budget, in real children on this CPU
(RLIMIT_DATA). An event that runs out of memory is named with its peak and the config
is not exported; the evaluation batch is tuned to fit and exported; the user's own
script evaluates, saves and trains with the export under the same budget."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import autotune
from job_script import BASE_ARGS, write_job

pytestmark = pytest.mark.slow

ONE_CONFIG = [
    "--rehearse",
    "--device",
    "cpu",
    "--lever",
    "torch_compile=false",
    "--precisions",
    "fp32",
    "--optimizers",
    "adamw_torch",
    "--checkpointing",
    "off",
    "--warmup-steps",
    "1",
    "--measure-steps",
    "2",
    "--confirm-top",
    "0",
    "--parity",
    "off",
    "--no-reuse",
    "--max-trials",
    "1",
]
# Training fits 1 GiB with room to spare; an evaluation that keeps the logits of its
# 2048 samples (fp32, every position's 260 scores, concatenated) does not
BUDGET = "1.05GiB"
LIMIT = int(1.05 * 0.95 * 2**30)  # the budget less the headroom, as the probes run
EVALUATES = {
    **BASE_ARGS,
    "eval_strategy": "steps",
    "eval_steps": 5,
    "per_device_eval_batch_size": 64,
    "save_strategy": "no",
}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_job(tmp_path_factory.mktemp("rehearsal"))


def test_an_evaluation_past_the_budget_gets_a_batch_that_fits_and_trains_in_their_script(
    job: Path,
) -> None:
    """Their compute_metrics keeps every batch's logits, and at their evaluation batch of
    64 the evaluation runs out of memory where training fits: the rehearsal finds a
    smaller batch that fits, the export carries it, and their own script, reading the
    export, evaluates every 5 steps and saves every 4 for 10 steps under the same limit.
    A time budget spent by the survey and the probe leaves the rehearsal no time: it runs
    past the budget and says so (it once was skipped, and the export, unrehearsed, kept
    the batch of 64 that dies at their first evaluation)."""
    args = {**EVALUATES, "save_strategy": "steps", "save_steps": 4}
    (job.parent / "evaluates.json").write_text(json.dumps(args))
    done = autotune(
        job.parent,
        "search",
        "--trainer",
        "job.py:evaluating",
        "--base-args",
        "evaluates.json",
        "--memory-budget",
        BUDGET,
        *ONE_CONFIG,
        "--time-budget",
        "10s",
        "--study",
        "evaluates",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = "rehearsal: before the export, the config to export runs your evaluation and a "
    assert said + "checkpoint save and resume under the budget" in done.stdout
    assert "trial 0, the first config that fits, runs your evaluation now" in done.stdout
    assert "it runs past the budget (no config is exported unrehearsed)" in done.stdout
    assert "trial 0: rehearsal: fits (train " in done.stdout
    assert "out of memory with evaluation batch 64" in done.stdout
    assert "past the time budget)" in done.stdout
    assert (
        "rehearsal: not run" not in done.stdout and "0 is exported unrehearsed" not in done.stdout
    )
    summary = json.loads((job.parent / "studies" / "evaluates.best.summary.json").read_text())
    assert summary["parity"]["rehearsal"].startswith("rehearsal: fits (train")
    exported = job.parent / "studies" / "evaluates.best.json"
    batch = json.loads(exported.read_text())["per_device_eval_batch_size"]
    assert 1 <= batch < 64
    # their arguments as they were (batch 64) die at the first evaluation: what the
    # rehearsal caught
    theirs = job.parent / "theirs.json"
    theirs.write_text(
        json.dumps({**json.loads(exported.read_text()), "per_device_eval_batch_size": 64})
    )
    with pytest.raises(AssertionError, match=r"MemoryError|allocate memory"):
        _train_in_their_script(job.parent, "evaluating", theirs, LIMIT, steps=10)
    ran = _train_in_their_script(job.parent, "evaluating", exported, LIMIT, steps=10)
    assert ran == {
        "evaluations": 2,
        "checkpoints": ["checkpoint-10", "checkpoint-4", "checkpoint-8"],
    }


def test_an_evaluation_that_fits_at_no_batch_stops_the_search_at_its_first_fit(
    job: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An evaluation set four times as large: the training still fits, but the logits it
    keeps do not, at their batch nor at any smaller one, which a pass's growth shows.
    The first config that fits rehearses it at once: the search stops there, with three
    minutes of budget and more configs left to probe, nothing is exported, and the last
    line says what would fit (it once explored on for the whole budget first)."""
    rows = (job.parent / "eval.jsonl").read_text()
    (job.parent / "eval-x4.jsonl").write_text(4 * rows)
    monkeypatch.setenv("JOB_EVAL", "eval-x4.jsonl")
    (job.parent / "tight.json").write_text(json.dumps(EVALUATES))
    # two precisions, four probes allowed: the search had more to explore
    configs = [("fp32,bf16" if a == "fp32" else a) for a in ONE_CONFIG[:-2]]
    done = autotune(
        job.parent,
        "search",
        "--trainer",
        "job.py:evaluating",
        "--base-args",
        "tight.json",
        "--memory-budget",
        BUDGET,
        *configs,
        "--max-trials",
        "4",
        "--time-budget",
        "3m",
        "--study",
        "tight",
    )
    assert done.returncode != 0, done.stdout
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("(preprocess_logits_for_metrics, e.g. an argmax)")
    )
    assert "trial 0, the first config that fits, runs your evaluation now" in done.stdout
    assert "(probe 1 of 4)" in done.stdout
    assert "trial 1" not in done.stdout, done.stdout  # no probe after the rehearsal
    assert "rehearsal: out of memory at evaluation at a peak of" in done.stderr, done.stderr
    # a pass that shows what the logits kept add up to (at 64 or 32) ends the halving:
    # no eighth
    assert "out of memory with evaluation batch 64" in done.stderr
    assert "evaluation batch 8" not in done.stderr
    assert "pile up with the evaluation set, whatever the batch (its pass would end" in (
        done.stderr
    )
    assert "prediction_loss_only=true" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (job.parent / "studies" / "tight.best.json").exists()


def test_a_save_that_runs_out_of_memory_is_named_and_nothing_is_exported(
    job: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their save holds 600 MiB more while it writes (as gathering ZeRO-3's full weights
    does): the training fits, the save does not."""
    monkeypatch.setenv("JOB_GATHER_MIB", "600")
    (job.parent / "saves.json").write_text(json.dumps({**BASE_ARGS, "save_steps": 100}))
    done = autotune(
        job.parent,
        "search",
        "--trainer",
        "job.py:gathering",
        "--base-args",
        "saves.json",
        "--memory-budget",
        BUDGET,
        *ONE_CONFIG,
        "--study",
        "saves",
    )
    assert done.returncode != 0, done.stdout
    assert "fail the rehearsal of your run's evaluation and save" in done.stderr, done.stderr
    assert "rehearsal: out of memory at save at a peak of" in done.stderr
    assert "trial 0: rehearsal: out of memory at save" in done.stdout
    assert not (job.parent / "studies" / "saves.best.json").exists()
    shown = autotune(job.parent, "show", "--study", "saves", "--format", "json")
    (row,) = json.loads(shown.stdout)["trials"]
    assert row["why"].startswith("rehearsal: out of memory at save"), row


def test_a_tuned_evaluation_batch_is_exported_and_read_back_by_hfargumentparser(
    tmp_path: Path,
) -> None:
    """A stand-in with a 32000-word vocabulary: its evaluation at the user's batch 64
    holds 64 x 128 x 32000 fp32 scores and more, past the budget; batch 1 fits, 32 does
    not, 16 does: exported, and read back as TrainingArguments."""
    from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, TrainingArguments

    config = GPT2Config(vocab_size=32000, n_embd=32, n_layer=1, n_head=2, n_positions=128)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "wide")
    base = {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "eval_strategy": "steps",
        "per_device_eval_batch_size": 64,
        "save_strategy": "no",
    }
    (tmp_path / "base.json").write_text(json.dumps(base))
    done = autotune(
        tmp_path,
        "search",
        "--model",
        "./wide",
        "--base-args",
        "base.json",
        "--seq-len",
        "128",
        "--memory-budget",
        "1.47GiB",
        *ONE_CONFIG,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "out of memory with evaluation batch 64; evaluation batch 32" in done.stdout
    exported = tmp_path / "studies" / "wide.best.json"
    (args,) = HfArgumentParser(TrainingArguments).parse_json_file(str(exported))
    assert args.per_device_eval_batch_size == 16
    summary = json.loads((tmp_path / "studies" / "wide.best.summary.json").read_text())
    assert summary["parity"]["rehearsal"].startswith("rehearsal: fits (train")


def _train_in_their_script(
    folder: Path, factory: str, exported: Path, limit: int, *, steps: int
) -> dict[str, object]:
    """Their script reads the export with HfArgumentParser and trains `steps` steps, its
    evaluations and saves included, in a process of its own under RLIMIT_DATA at the
    search's limit, Arrow's pool off."""
    code = textwrap.dedent(
        f"""
        import json, os, resource, sys
        sys.path.insert(0, {str(folder)!r})
        from transformers import HfArgumentParser
        from trl import SFTConfig
        import job
        (args,) = HfArgumentParser(SFTConfig).parse_json_file({str(exported)!r})
        args.max_steps, args.output_dir = {steps}, {str(folder / "their-run")!r}
        resource.setrlimit(resource.RLIMIT_DATA, ({limit}, {limit}))
        trainer = job.{factory}(args)
        trainer.train()
        evaluations = sum("eval_loss" in h for h in trainer.state.log_history)
        print(json.dumps({{"evaluations": evaluations,
                          "checkpoints": sorted(n for n in os.listdir(args.output_dir)
                                                if n.startswith("checkpoint-"))}}))
        """
    )
    env = {"HF_HUB_OFFLINE": "1", "ARROW_DEFAULT_MEMORY_POOL": "system", "PATH": "/usr/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))
