"""What the rehearsal will run, read from the user's arguments, and said first."""

from __future__ import annotations

import dataclasses

from helpers import SPEC

from autotune.tuning.rehearsal import RunEvents, _halves, plan_line


def test_the_rehearsal_runs_the_events_their_run_has_and_says_which_it_has_not() -> None:
    """The Trainer saves by default and evaluates only when asked; their evaluation and
    save settings (carried or kept from --base-args) are what the rehearsal runs."""
    plain = RunEvents.of(SPEC)
    assert (plain.evaluate, plain.save) == (False, True)
    assert plan_line(SPEC).endswith(
        "; no evaluation: your run does not evaluate (eval_strategy no)"
    )
    theirs = dataclasses.replace(
        SPEC,
        base_arguments={"per_device_eval_batch_size": 64, "learning_rate": 1e-4},
        kept_arguments={"eval_strategy": "steps", "save_strategy": "no"},
    )
    events = RunEvents.of(theirs)
    assert (events.evaluate, events.save) == (True, False)
    assert events.fields == {"per_device_eval_batch_size": 64}  # not their learning rate
    assert "runs your evaluation under the budget" in plan_line(theirs)
    neither = dataclasses.replace(theirs, kept_arguments={"save_strategy": "no"})
    assert plan_line(neither) == (
        "rehearsal: none (your run neither evaluates nor saves checkpoints)"
    )


def test_a_smaller_evaluation_batch_is_half_a_quarter_then_an_eighth_of_theirs() -> None:
    assert _halves(64) == [32, 16, 8]
    assert _halves(5) == [2, 1]
    assert _halves(1) == []
