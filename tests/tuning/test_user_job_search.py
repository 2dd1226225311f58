"""Searching the user's own job (`--trainer job.py:make_trainer`): a LoRA adapter inside
TRL's SFTTrainer on a model loaded with from_pretrained, their jsonl data. Every probe
calls their factory in its own process; the export is their SFTConfig; bad factories
get one line and leave nothing behind."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import autotune
from job_script import BASE_ARGS, imported, write_job

pytestmark = pytest.mark.slow

SMALL = [
    "--device",
    "cpu",
    "--memory-budget",
    "4GiB",
    "--lever",
    "torch_compile=false",
    "--warmup-steps",
    "1",
    "--measure-steps",
    "2",
    "--quiet",
]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    script = write_job(tmp_path_factory.mktemp("job"))
    (script.parent / "base.json").write_text(json.dumps(BASE_ARGS))
    return script


def _calls(job: Path) -> list[str]:
    log = job.parent / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_lora_sft_job_is_searched_through_its_factory_and_exported_as_sftconfig(
    job: Path,
) -> None:
    from transformers import HfArgumentParser
    from trl import SFTConfig

    before = len(_calls(job))
    done = autotune(
        job.parent,
        "search",
        "--trainer",
        "job.py:make_trainer",
        "--base-args",
        "base.json",
        *SMALL,
        "--precisions",
        "fp32,bf16",
        "--optimizers",
        "adamw_torch,adafactor",
        "--checkpointing",
        "on",
        "--max-trials",
        "2",
        "--confirm-top",
        "1",
        "--parity",
        "quick",
        "--rehearse",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    calls = _calls(job)[before:]
    # the survey, two probes and a confirmation, each its own process; no rehearsal: a
    # LoRA adapter's checkpoint fits beside the training's peak whatever a save holds
    per_process = Counter(c.split()[0] for c in calls)
    assert len(calls) >= 4 and set(per_process.values()) == {1}, calls
    assert "rehearsal: not needed: its measured peak" in done.stdout
    assert {c.split()[1] for c in calls[1:]} <= {"1", "2", "4", "8"}  # the searched splits
    (args,) = HfArgumentParser(SFTConfig).parse_json_file(str(job.parent / "studies/job.best.json"))
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 8
    assert (args.max_length, args.dataset_text_field) == (64, "text")  # theirs, kept
    assert (args.learning_rate, args.lr_scheduler_type) == (0.001, "cosine")
    assert (args.max_steps, args.output_dir) == (30, "runs/mine")  # their run, not a probe's
    assert args.activation_checkpointing is True
    trial = json.loads(next((job.parent / "studies/job/trials").glob("*/config.json")).read_text())
    assert trial["model"]["source"] == "factory" and trial["model"]["args_class"] == "trl.SFTConfig"
    assert trial["model"]["adapter"]["peft_type"] == "LORA"  # read off what was built
    assert trial["model"]["adapter"]["r"] == 4
    result = json.loads(next((job.parent / "studies/job/trials").glob("*/result.json")).read_text())
    assert result["outcome"] == "ok" and result["peak_memory_bytes"] > 0
    # their own script trains with the export
    with imported(job.parent) as theirs:
        args.max_steps, args.output_dir = 2, str(job.parent / "runs")
        assert theirs.make_trainer(args).train().global_step == 2


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("missing.py:make_trainer", "no such file missing.py"),
        ("job.py:nope", "job.py has no function 'nope'"),
        ("job.py:raises", "job.py:raises raised ValueError: the tokenizer folder is missing"),
        ("job.py:not_a_trainer", "not_a_trainer returned dict, not a transformers Trainer"),
        ("job.py:ignores_args", "your factory must pass `args` to the Trainer"),
    ],
)
def test_a_bad_factory_gets_one_line_and_nothing_is_written(
    job: Path, reference: str, message: str
) -> None:
    done = autotune(
        job.parent,
        "search",
        "--trainer",
        reference,
        "--base-args",
        "base.json",
        *SMALL,
        "--study",
        "bad",
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert message in lines[-1] and lines[-1].startswith("error: ")
    assert "Traceback" not in done.stderr
    assert not (job.parent / "studies" / "bad").exists()


def test_a_factory_that_fails_for_one_config_makes_that_trial_an_error(
    job: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOB_REFUSES", "adafactor")
    done = autotune(
        job.parent,
        "search",
        "--trainer",
        "job.py:make_trainer",
        "--base-args",
        "base.json",
        *SMALL,
        "--precisions",
        "fp32",
        "--optimizers",
        "adamw_torch,adafactor",
        "--checkpointing",
        "off",
        "--max-trials",
        "2",
        "--confirm-top",
        "0",
        "--parity",
        "off",
        "--study",
        "refuses",
        "--no-reuse",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shown = autotune(job.parent, "show", "--study", "refuses", "--format", "json")
    trials = {t["training_arguments"]["optim"]: t for t in json.loads(shown.stdout)["trials"]}
    assert trials["adafactor"]["outcome"] == "error"
    assert "this job cannot run adafactor" in trials["adafactor"]["why"]
    assert (
        json.loads((job.parent / "studies/refuses.best.json").read_text())["optim"] == "adamw_torch"
    )


def test_sft_padding_free_and_packing_are_timed_on_their_own_batches_in_their_sftconfig(
    job: Path,
) -> None:
    """Under a max_length their data never reaches, SFTTrainer takes padding_free: the
    search tries it against padded batches (asked for: on sdpa it is not offered), all
    also timed on the user's own batches in their order (their longest samples, which
    set the peak, have little padding to drop), and sets it in their SFTConfig with
    max_length null, as SFTTrainer asks. Packing, asked for, fills rows of max_length
    with several samples: its probe trains the fullest rows, its step times count as a
    step of the global batch at the data's mean length, its parity is unchecked (its
    steps train other samples), and its fields pack in their own script."""
    from transformers import HfArgumentParser
    from trl import SFTConfig

    base = {**BASE_ARGS, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}
    (job.parent / "unpadded.json").write_text(json.dumps({**base, "max_length": 200}))
    done = autotune(
        job.parent,
        "search",
        "--trainer",
        "job.py:make_trainer",
        "--base-args",
        "unpadded.json",
        *SMALL,
        "--lever",  # it runs sdpa: searched where asked
        "padding_free=false,true",
        "--lever",
        "packing=false,true",
        "--precisions",
        "fp32",
        "--optimizers",
        "adamw_torch",
        "--checkpointing",
        "off",
        "--max-trials",
        "3",
        "--confirm-top",
        "0",
        "--parity",
        "quick",
        "--study",
        "unpadded",
        "--no-reuse",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shown = autotune(job.parent, "show", "--study", "unpadded", "--format", "json")
    ok = [t for t in json.loads(shown.stdout)["trials"] if t["outcome"] == "ok"]
    trials = {
        (
            t["training_arguments"].get("padding_free", False),
            "packing" in t["training_arguments"],
        ): t
        for t in ok
    }
    assert set(trials) == {(False, False), (True, False), (False, True)}, [t["config"] for t in ok]
    flat, padded, packed = trials[True, False], trials[False, False], trials[False, True]
    assert "padding-free" in flat["config"] and flat["training_arguments"]["max_length"] is None
    assert "max_length" not in padded["training_arguments"]  # theirs, 200, stays
    for trial in (flat, padded, packed):  # the worst case set the peak; their batches the speed
        assert trial["worst_case_samples_per_s"] and trial["samples_per_s"], trial
        assert trial["predicted_peak_gib"] and trial["peak_memory_gib"], trial
    assert padded["padding_pct"] > 10 and flat["padding_pct"] == 0 == packed["padding_pct"]
    # rows of 200 tokens hold several of their samples (mean ~60 tokens): a step of 8
    # rows trains far more than the global batch of 8
    assert "packed" in packed["config"] and packed["samples_per_step"] > 16
    assert packed["training_arguments"]["packing_strategy"] == "bfd"
    assert packed["parity"] == "unchecked" and "packed rows" in packed["parity_figures"]
    assert padded["parity"] == flat["parity"] == "same-arithmetic"
    # what an export of either writes trains in their own script
    for trial, flattened in ((flat, "padding_free"), (packed, "packing")):
        fields = {**base, "max_length": 200, **trial["training_arguments"]}
        fields |= {"max_steps": 2, "output_dir": str(job.parent / "runs")}
        (args,) = HfArgumentParser(SFTConfig).parse_dict(fields)
        with imported(job.parent) as theirs:
            trainer = theirs.make_trainer(args)
            assert trainer.padding_free and getattr(args, flattened) is True
            packs = "seq_lengths" in trainer.train_dataset.column_names
            assert packs == (flattened == "packing")
            assert trainer.train().global_step == 2


def test_a_lora_stand_in_probes_the_adapter_and_exports_plain_arguments(tmp_path: Path) -> None:
    from conftest import TINY_GPT2, write_model

    write_model(tmp_path / "tiny", TINY_GPT2)
    done = autotune(
        tmp_path,
        "search",
        "--model",
        "./tiny",
        "--lora",
        "r=4,alpha=8,targets=c_attn",
        *SMALL,
        "--global-batch-size",
        "8",
        "--seq-len",
        "32",
        "--precisions",
        "fp32",
        "--optimizers",
        "adamw_torch",
        "--checkpointing",
        "on",
        "--max-trials",
        "1",
        "--confirm-top",
        "0",
        "--parity",
        "off",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trial = json.loads(next((tmp_path / "studies/tiny/trials").glob("*/config.json")).read_text())
    assert trial["model"]["adapter"] == {
        "peft_type": "LORA",
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["c_attn"],
    }
    result = json.loads(next((tmp_path / "studies/tiny/trials").glob("*/result.json")).read_text())
    assert result["outcome"] == "ok", result
    exported = json.loads((tmp_path / "studies/tiny.best.json").read_text())
    assert exported["activation_checkpointing"] is True  # checkpointing trains the adapter
    bad = autotune(tmp_path, "search", "--model", "./tiny", "--lora", "targets=q_proj", *SMALL)
    assert bad.returncode == 2 and "--lora: Target modules" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_factorys_probes_train_on_its_longest_samples_only(
    job: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its data holds lines of 2 to 20 words; every sample a probe trains on is one of
    the longest, so the peak it measures is the peak of any batch of the user's run."""
    monkeypatch.setenv("JOB_LOG_BATCHES", "1")
    log = job.parent / "batches.log"
    log.unlink(missing_ok=True)
    done = autotune(
        job.parent,
        "search",
        "--trainer",
        "job.py:make_trainer",
        "--base-args",
        "base.json",
        *SMALL,
        "--precisions",
        "fp32",
        "--optimizers",
        "adamw_torch",
        "--checkpointing",
        "off",
        "--max-trials",
        "1",
        "--confirm-top",
        "0",
        "--parity",
        "off",
        "--study",
        "longest",
        "--no-reuse",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lengths = [int(n) for line in log.read_text().splitlines() for n in line.split()]
    assert len(lengths) >= 8  # a probe's batches were collated and logged
    assert set(lengths) == {max(lengths)}, sorted(set(lengths))
    # which samples those are was read once, in the survey, and handed to the probe
    trial = json.loads(
        next((job.parent / "studies/longest/trials").glob("*/config.json")).read_text()
    )
    assert len(trial["longest_samples"]) == 8  # a global batch's worth
