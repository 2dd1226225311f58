"""The first guesses (tuning/guesses.py): a guess memory rules out is tried where it fits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from helpers import SPACE as HELPER_SPACE
from helpers import SPEC, rec

from autotune.core.enums import Precision
from autotune.core.parity import Arithmetic
from autotune.core.trial import Candidate
from autotune.tuning.guesses import first_guesses, fitted_guess

SPACE = dataclasses.replace(HELPER_SPACE, optimizers=("adamw_torch", "adamw_torch_fused"))
JOB = dataclasses.replace(SPEC, space=SPACE)


def up_to(batch: int) -> Callable[[Candidate], bool]:
    """The estimate's verdict, as the search asks it: fits up to this micro-batch."""
    return lambda c: c.per_device_train_batch_size <= batch


def everything() -> list[Candidate]:
    return list(SPACE.candidates())


def test_a_guess_the_estimate_rules_out_is_tried_at_the_largest_batch_that_fits() -> None:
    plain, fast = first_guesses(JOB)
    assert fast.per_device_train_batch_size == 32  # the usual fast settings: one of them
    measured = [rec(0, plain)]
    fitted = fitted_guess(JOB, measured, everything(), up_to(16))
    assert fitted == dataclasses.replace(
        fast, per_device_train_batch_size=16, gradient_accumulation_steps=4
    )  # its precision, optimizer and levers, the same 64 samples a step


def test_the_largest_batch_still_open_is_taken() -> None:
    plain, fast = first_guesses(JOB)
    shut = {c for c in everything() if c.per_device_train_batch_size == 16}
    opened = [c for c in everything() if c not in shut]
    fitted = fitted_guess(JOB, [rec(0, plain)], opened, up_to(16))
    assert fitted is not None and fitted.per_device_train_batch_size == 8
    assert (fitted.precision, fitted.optim) == (fast.precision, fast.optim)


def test_nothing_is_proposed_once_the_guess_has_had_its_probe() -> None:
    plain, fast = first_guesses(JOB)
    fitted = fitted_guess(JOB, [rec(0, plain)], everything(), up_to(16))
    assert fitted is not None
    # measured, in flight, or fitting as it was: no guess is left to fit
    assert fitted_guess(JOB, [rec(0, plain), rec(1, fitted)], everything(), up_to(16)) is None
    assert fitted_guess(JOB, [rec(0, plain)], everything(), up_to(16), in_flight=[fitted]) is None
    assert fitted_guess(JOB, [rec(0, plain)], everything(), up_to(64)) is None
    assert fitted_guess(JOB, [rec(0, plain), rec(1, fast)], everything(), up_to(16)) is None


def test_the_users_recipe_comes_first_made_to_fit() -> None:
    """Their own recipe at 64 samples a device does not fit: what they would run is
    measured at the batch that does, before the other guesses' settings."""
    job = dataclasses.replace(
        JOB, recipe_settings={"per_device_train_batch_size": 64, "bf16": True}
    )
    recipe = first_guesses(job)[0]
    assert (recipe.per_device_train_batch_size, str(recipe.precision)) == (64, "bf16")
    fitted = fitted_guess(job, [], everything(), up_to(16))
    assert fitted == dataclasses.replace(
        recipe, per_device_train_batch_size=16, gradient_accumulation_steps=4
    )


KEEP = {Arithmetic(Precision.FP32, "adamw_torch")}  # the recipe's: fp32 AdamW


def test_where_only_the_recipes_arithmetic_may_be_exported_a_guess_is_made_to_keep_it() -> None:
    """The fast guess (bf16, fused AdamW) cannot be confirmed in the time left: its fp32
    self, fused AdamW and its levers kept, is probed instead, at the largest batch that
    fits; where that fits as it is, as it is. Once measured, nothing is left to propose."""
    job = dataclasses.replace(JOB, device=dataclasses.replace(JOB.device, native_bf16=True))
    plain, fast = first_guesses(job)
    assert (str(fast.precision), fast.optim) == ("bf16", "adamw_torch_fused")
    kept = dataclasses.replace(fast, precision=plain.precision)
    assert str(kept.precision) == "fp32" and kept != plain
    fitted = fitted_guess(job, [rec(0, plain)], everything(), up_to(16), allowed=KEEP)
    assert fitted == dataclasses.replace(
        kept, per_device_train_batch_size=16, gradient_accumulation_steps=4
    )
    roomy = fitted_guess(job, [rec(0, plain)], everything(), up_to(64), allowed=KEEP)
    assert roomy == kept  # it fits: the guess made to keep, not queued, is proposed here
    assert (
        fitted_guess(job, [rec(0, plain), rec(1, kept)], everything(), up_to(64), allowed=KEEP)
        is None
    )
    # without `allowed` the guess keeps its own arithmetic
    assert fitted_guess(job, [rec(0, plain)], everything(), up_to(64)) is None
    # parity verified the guess's arithmetic: it may be exported as it is, queued
    verified = {*KEEP, Arithmetic.of(fast)}
    assert fitted_guess(job, [rec(0, plain)], everything(), up_to(64), allowed=verified) is None
    # a guess that ran, as it is or fitted, has had its probe: no fp32 self is forced in
    smaller = dataclasses.replace(
        fast, per_device_train_batch_size=16, gradient_accumulation_steps=4
    )
    for ran in (fast, smaller):
        assert (
            fitted_guess(job, [rec(0, plain), rec(1, ran)], everything(), up_to(64), allowed=KEEP)
            is None
        )
