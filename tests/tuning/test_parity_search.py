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
from autotune.tuning.parity import reference_candidate, twin_of

ARGS = [
    "search",
    "--model",
    "./tiny",
    "--device",
    "cpu",
    *PLAIN_LEVERS,
    "--global-batch-size",
    "16",
    "--seq-len",
    "64",
    "--precisions",
    "fp32",
    "--optimizers",
    "adamw_torch,sgd",
    "--checkpointing",
    "off",
    "--max-trials",
    "4",
    "--warmup-steps",
    "1",
    "--measure-steps",
    "2",
    "--confirm-top",
    "4",
    "--confirm-steps",
    "2",
    "--quiet",
]


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


@pytest.mark.slow
def test_a_short_check_never_calls_adafactor_the_same_training(tmp_path: Path) -> None:
    """3 steps beside an AdamW recipe cannot tell Adafactor's drift from rounding: its
    verdict is unverified (or diverged), never ok, and without --parity quick it is not
    exported."""
    write_model(tmp_path / "tiny", TINY_GPT2)
    args = [a if a != "adamw_torch,sgd" else "adamw_torch,adafactor" for a in ARGS]
    done = autotune(tmp_path, *args, "--parity-steps", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "parity  fp32 adafactor: " in done.stdout, done.stdout
    assert "parity  fp32 adafactor: ok" not in done.stdout
    rows = json.loads(autotune(tmp_path, "show", "--study", "tiny", "--format", "json").stdout)
    adafactor = [r for r in rows["trials"] if " adafactor" in r["config"] and r["outcome"] == "ok"]
    assert adafactor and {r["parity"] for r in adafactor} <= {"unverified", "diverged"}
    exported = json.loads((tmp_path / "studies" / "tiny.best.json").read_text())
    assert exported["optim"] == "adamw_torch"


@pytest.mark.slow
def test_each_probe_carries_its_own_parity_evidence_and_quick_runs_no_parity_run(
    tmp_path: Path,
) -> None:
    """--parity quick: no parity run; every probe trains from the same weights on the same
    batches, so two probes of one arithmetic (AdamW at 16x1 and 8x2) record the same
    losses step by step, while SGD's (an optimizer change) fall far slower: diverged from
    the probes alone, never exported."""
    write_model(tmp_path / "tiny", TINY_GPT2)
    args = [a if a != "2" else "4" for a in ARGS]  # --measure-steps 4: longer evidence
    # every probe its 5 steps: one cut short as clearly slower has too few losses to judge
    done = autotune(tmp_path, *args, "--parity", "quick", "--fixed-steps")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not list((tmp_path / "studies" / "tiny" / "trials").glob("parity-*"))
    assert "parity  fp32 sgd: diverged: loss" in done.stdout, done.stdout
    assert "probe steps" in done.stdout
    exported = json.loads((tmp_path / "studies" / "tiny.best.json").read_text())
    assert exported["optim"] == "adamw_torch"
    losses = {}
    for trial in (tmp_path / "studies" / "tiny" / "trials").glob("[0-9]"):
        candidate = json.loads((trial / "config.json").read_text())["candidate"]
        result = json.loads((trial / "result.json").read_text())
        assert result["outcome"] != "ok" or result["step_losses"], result
        losses[(candidate["optim"], candidate["per_device_train_batch_size"])] = result[
            "step_losses"
        ]
    big, small = losses[("adamw_torch", 16)], losses[("adamw_torch", 8)]
    steps = min(len(big), len(small))
    assert steps >= 3 and big[-1] < big[0]  # learnable data: the loss falls
    for a, b in zip(big[:steps], small[:steps], strict=True):  # rounding apart, no more
        assert abs(a - b) <= 0.01 * abs(a), (big, small)
    sgd = next(v for (optim, _), v in losses.items() if optim == "sgd")
    n = min(len(sgd), steps)
    assert big[0] - big[n - 1] > 5 * abs(sgd[0] - sgd[n - 1])


def test_the_reference_is_the_users_recipe_else_the_plain_default_at_the_largest_fit() -> None:
    records = [
        rec(0, cand(8), sps=10.0),
        rec(1, cand(32), sps=12.0),
        rec(2, cand(64), sps=0.0, peak_gib=999.0),
    ]
    plain = reference_candidate(SPEC, records)
    assert (plain.precision, plain.optim, plain.per_device_train_batch_size) == (
        Precision.FP32,
        "adamw_torch",
        32,
    )
    users = SPEC.__class__(
        **{
            **SPEC.__dict__,
            "recipe_settings": {
                "bf16": True,
                "optim": "adafactor",
                "per_device_train_batch_size": 4,
            },
        }
    )
    recipe = reference_candidate(users, records)
    assert (recipe.precision, recipe.optim, recipe.per_device_train_batch_size) == (
        Precision.BF16,
        "adafactor",
        4,
    )
    assert recipe.gradient_accumulation_steps == SPEC.global_batch_size // 4
    twin = twin_of(SPEC, plain)
    assert twin is not None and twin.per_device_train_batch_size == 16
    # Their micro-batch measured out of memory: the largest of their arithmetic that fits.
    too_big = [*records, rec(3, cand(16), Outcome.OOM)]
    theirs = SPEC.__class__(
        **{**SPEC.__dict__, "recipe_settings": {"per_device_train_batch_size": 16}}
    )
    assert reference_candidate(theirs, too_big).per_device_train_batch_size == 32
    assert reference_candidate(theirs, records).per_device_train_batch_size == 16


def test_a_parity_run_trains_the_quickest_measured_config_of_the_finalists_arithmetic() -> None:
    """A compiled finalist (25 s of compilation in its one-time cost) is judged by the
    uncompiled run of its arithmetic, which finishes the parity steps first; a config
    that does not fit, or of another arithmetic, is never the one trained."""
    import dataclasses

    from autotune.core.trial import Candidate, TrialRecord
    from autotune.tuning.parity import quickest_alike

    def timed(
        number: int, candidate: Candidate, step_s: float, one_time_s: float, peak_gib: float = 1.0
    ) -> TrialRecord:
        r = rec(number, candidate, peak_gib=peak_gib)
        return dataclasses.replace(
            r,
            result=r.result.replace(
                step_time_median_s=step_s, step_times_s=(step_s,) * 5, one_time_s=one_time_s
            ),
        )

    compiled = dataclasses.replace(cand(16, "bf16"), torch_compile=True)
    plain = cand(8, "bf16")
    records = [
        timed(0, compiled, 0.8, 25.0),  # 25 + 20 x 0.8 = 41 s
        timed(1, plain, 1.0, 2.0),  # 22 s
        timed(2, cand(32, "bf16"), 0.5, 1.0, peak_gib=999.0),  # does not fit
        timed(3, cand(64), 0.1, 0.0),  # fp32: another arithmetic
    ]
    limit = SPEC.fit_limit_bytes
    assert quickest_alike(compiled, records, limit, steps=20) == plain
    # over 200 steps the compiled run is quicker: 25 + 160 s against 202 s
    assert quickest_alike(plain, records, limit, steps=200) == compiled
    unmeasured = cand(16, "fp16")
    assert quickest_alike(unmeasured, records, limit, steps=20) == unmeasured


def test_the_reference_run_trains_the_quickest_measured_config_of_the_recipes_arithmetic() -> None:
    """The main job's reference (16x1 fp32 AdamW, never probed) took 475 s; 16x1 fp32
    fused AdamW, the same arithmetic, was measured 25% quicker than the plain 8x2."""
    import dataclasses
    from types import SimpleNamespace

    from autotune.core.enums import Objective
    from autotune.core.parity import Curve
    from autotune.core.parity_state import ParityState
    from autotune.core.trial import Candidate
    from autotune.tuning.limits import SearchLimits
    from autotune.tuning.parity import ParityCheck

    fused = dataclasses.replace(cand(16), optim="adamw_torch_fused")
    records = [
        dataclasses.replace(
            r, result=r.result.replace(step_time_median_s=64 / sps, step_times_s=(64 / sps,) * 5)
        )
        for r, sps in (
            (rec(0, cand(8), sps=1.51), 1.51),
            (rec(1, fused, sps=1.89), 1.89),
            (rec(2, cand(8, "bf16"), sps=3.0), 3.0),
        )
    ]
    store = SimpleNamespace(records=lambda: records)
    observer = SimpleNamespace(on_parity=lambda candidate, verdict: None)
    run = SimpleNamespace(store=store, spec=SPEC, observer=observer)
    limits = SearchLimits(parity_steps=20, confirm_top=1, objective=Objective.THROUGHPUT)
    check = ParityCheck(run, limits)  # type: ignore[arg-type]
    trained: dict[str, Candidate] = {}
    curve = Curve(((0, 5.0), (20, 4.0)), steps=20)

    def fake_curve(label: str, candidate: Candidate) -> Curve:
        trained[label] = candidate
        return curve

    check._curve = fake_curve  # type: ignore[method-assign]
    state = ParityState(cand(16), steps=20, learning_rate=1e-3, seed=0)
    check._judge(state, cand(8, "bf16"))
    assert trained["reference"] == fused
    assert trained["bf16-adamw_torch"] == cand(8, "bf16")


def test_the_headline_compares_with_their_recipe_where_it_was_measured() -> None:
    import dataclasses

    from autotune.tuning.parity import baseline

    records = [rec(0, cand(8), sps=10.0), rec(1, cand(16, "bf16"), sps=14.0)]
    assert baseline(SPEC, records, None) == (records[0], "the plain default")
    theirs = dataclasses.replace(
        SPEC, recipe_settings={"bf16": True, "per_device_train_batch_size": 16}
    )
    assert baseline(theirs, records, None) == (records[1], "your recipe")
    # their recipe not measured (or not fitting): the plain default, named as such
    assert baseline(theirs, records[:1], None) == (records[0], "the plain default")
