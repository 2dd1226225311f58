"""Training parity in a real search: an optimizer that learns far slower at the recipe's
learning rate (SGD; on this CPU about as fast per step as AdamW) is shown as diverged,
with its figures, and never exported; --parity off says the check was off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PLAIN_LEVERS, TINY_GPT2, autotune, write_model
from helpers import SPEC, cand, rec

from autotune.core.enums import Outcome, Precision
from autotune.search.parity import reference_candidate, twin_of

ARGS = [
    "search", "--model", "./tiny", "--device", "cpu", *PLAIN_LEVERS, "--global-batch-size", "16",
    "--seq-len", "64", "--precisions", "fp32", "--optimizers", "adamw_torch,sgd",
    "--checkpointing", "off", "--max-trials", "4", "--warmup-steps", "1",
    "--measure-steps", "2", "--confirm-top", "4", "--confirm-steps", "2", "--quiet",
]  # fmt: skip


@pytest.mark.slow
def test_sgd_is_faster_but_diverged_and_adamw_is_exported(tmp_path: Path) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    done = autotune(tmp_path, *ARGS)
    assert done.returncode == 0, done.stdout + done.stderr
    exported = json.loads((tmp_path / "studies" / "tiny.best.json").read_text())
    assert exported["optim"] == "adamw_torch"
    summary = json.loads((tmp_path / "studies" / "tiny.best.summary.json").read_text())
    assert summary["parity"]["status"] == "same-arithmetic"
    assert summary["parity"]["tolerance"].startswith("5.0% of the reference's progress")
    assert "parity  fp32 sgd: diverged: loss" in done.stdout
    assert "learns slower than the reference" in done.stdout
    shown = autotune(tmp_path, "show", "--study", "tiny", "--format", "json")
    rows = json.loads(shown.stdout)["trials"]
    sgd = [r for r in rows if " sgd" in r["config"]]
    assert sgd and all(r["parity"] == "diverged" for r in sgd)
    assert all("vs reference" in r["why"] for r in sgd)
    adamw = [r for r in rows if " adamw_torch " in f"{r['config']} " and r["outcome"] == "ok"]
    assert adamw and all(r["parity"] == "same-arithmetic" for r in adamw)


@pytest.mark.slow
def test_parity_off_exports_the_fastest_and_says_it_was_not_checked(tmp_path: Path) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    done = autotune(tmp_path, *ARGS, "--parity", "off")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "parity  " not in done.stdout
    summary = json.loads((tmp_path / "studies" / "tiny.best.summary.json").read_text())
    assert summary["parity"]["status"] == "unchecked"
    assert "--parity off" in summary["parity"]["verdict"]


def test_the_reference_is_the_users_recipe_else_the_plain_default_at_the_largest_fit() -> None:
    records = [rec(0, cand(8), sps=10.0), rec(1, cand(32), sps=12.0),
               rec(2, cand(64), sps=0.0, peak_gib=999.0)]  # fmt: skip
    plain = reference_candidate(SPEC, records)
    assert (plain.precision, plain.optim, plain.per_device_train_batch_size) == (
        Precision.FP32, "adamw_torch", 32)  # fmt: skip
    users = SPEC.__class__(**{**SPEC.__dict__, "recipe_settings": {
        "bf16": True, "optim": "adafactor", "per_device_train_batch_size": 4}})  # fmt: skip
    recipe = reference_candidate(users, records)
    assert (recipe.precision, recipe.optim, recipe.per_device_train_batch_size) == (
        Precision.BF16, "adafactor", 4)  # fmt: skip
    assert recipe.gradient_accumulation_steps == SPEC.global_batch_size // 4
    twin = twin_of(SPEC, plain)
    assert twin is not None and twin.per_device_train_batch_size == 16
    # Their micro-batch measured out of memory: the largest of their arithmetic that fits.
    too_big = [*records, rec(3, cand(16), Outcome.OOM)]
    theirs = SPEC.__class__(**{**SPEC.__dict__, "recipe_settings": {
        "per_device_train_batch_size": 16}})  # fmt: skip
    assert reference_candidate(theirs, too_big).per_device_train_batch_size == 32
    assert reference_candidate(theirs, records).per_device_train_batch_size == 16
