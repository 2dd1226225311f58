"""What the rehearsal will run, read from the user's arguments, and said first."""

from __future__ import annotations

import dataclasses
import types

from helpers import SPEC, cand, rec

from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.tuning.rehearsal import RunEvents, _halves, plan_line, rehearse_selected


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


def test_a_config_left_unrehearsed_for_want_of_time_is_said_once() -> None:
    """The search tries the rehearsal before confirming and again after; a config the
    time left cannot rehearse is announced the first time only."""
    said: list[str] = []
    probe = rec(0, cand(8))
    timed = dataclasses.replace(
        probe, result=dataclasses.replace(probe.result, phases_s={"wall": 30.0})
    )
    run = types.SimpleNamespace(
        spec=SPEC,
        store=types.SimpleNamespace(records=lambda: [timed]),
        limits=SearchLimits(),
        observer=types.SimpleNamespace(on_plan=said.append),
    )
    nearly_over = Deadline.after(5.0)
    first = rehearse_selected(run, nearly_over)  # type: ignore[arg-type]
    assert first == 0 and len(said) == 1 and "trial 0 is exported unrehearsed" in said[0]
    assert rehearse_selected(run, nearly_over, said=first) == 0  # type: ignore[arg-type]
    assert len(said) == 1
