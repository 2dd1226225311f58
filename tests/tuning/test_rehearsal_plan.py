"""What the rehearsal will run, read from the user's arguments, and said first."""

from __future__ import annotations

import dataclasses
import types

import pytest
from helpers import SPEC, cand, rec

from autotune.core.trial import TrialRecord
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.tuning.rehearsal import (
    SAVE_BYTES_PER_S,
    RunEvents,
    _halves,
    checkpoint_bytes,
    expected_s,
    plan_line,
    rehearse_selected,
    reserved_s,
)


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


def _probed(wall: float, train: float, step: float) -> TrialRecord:
    probe = rec(0, cand(8))
    result = dataclasses.replace(
        probe.result, phases_s={"wall": wall, "train": train}, step_time_median_s=step
    )
    return dataclasses.replace(probe, result=result)


def test_a_save_only_rehearsal_is_planned_at_what_it_runs_not_a_whole_probe() -> None:
    """Its probe's one-time part, two steps and the checkpoint written and read back; a
    run that evaluates adds a probe's time for its evaluation pass over data of unknown
    size. Exploring leaves the median of those (a probe's time before any fits)."""
    probe = _probed(wall=20.0, train=14.0, step=4.0)  # 6 s once, 3 timed steps and a warm-up
    saving = dataclasses.replace(SPEC, parameters=10**6)
    disk = 2 * checkpoint_bytes(saving, probe.candidate) / SAVE_BYTES_PER_S
    assert checkpoint_bytes(saving, probe.candidate) == 10**6 * (4 + 8)  # fp32 + AdamW
    assert expected_s(probe, saving) == pytest.approx(6.0 + 2 * 4.0 + disk)
    evaluating = dataclasses.replace(saving, base_arguments={"eval_strategy": "steps"})
    assert expected_s(probe, evaluating) == pytest.approx(6.0 + 2 * 4.0 + disk + 20.0)
    assert reserved_s([probe], saving, probe_s=20.0) == expected_s(probe, saving)
    assert reserved_s([], saving, probe_s=20.0) == 20.0
    only_model = dataclasses.replace(saving, base_arguments={"save_only_model": True})
    assert checkpoint_bytes(only_model, probe.candidate) == 10**6 * 4
