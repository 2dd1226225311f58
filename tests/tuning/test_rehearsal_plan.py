"""What the rehearsal will run, read from the user's arguments, and said first."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import pytest
from helpers import SPEC, cand, rec

from autotune.core.rehearsal import Event, Rehearsal
from autotune.core.trial import TrialRecord
from autotune.tuning.limits import SearchLimits
from autotune.tuning.rehearsal import (
    SAVE_BYTES_PER_S,
    RunEvents,
    _halves,
    checkpoint_bytes,
    checkpoint_room,
    expected_s,
    plan_line,
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


def _probed(phases: dict[str, float], peak_gib: float = 1.0) -> TrialRecord:
    probe = rec(0, cand(8), peak_gib=peak_gib)
    result = dataclasses.replace(probe.result, phases_s=phases, step_time_median_s=4.0)
    return dataclasses.replace(probe, result=result)


def test_a_save_only_rehearsal_is_planned_at_what_it_runs_not_a_whole_probe() -> None:
    """Its probe less what the probe timed (the child, imports, the job built, its first
    steps), the resume's new Trainer and first steps again (the warm-up, which holds the
    factory's build), and the checkpoint written and read back; a run that evaluates
    adds a probe's time for its evaluation pass over data of unknown size. Exploring
    leaves the median of those (a probe's time before any fits)."""
    # 5 s of imports, a 7 s warm-up (the factory's build), 3 timed steps, 2 s of its own
    # batches, 1 s for the peak FLOPs, 1 s reading its optimizer's state for subnormals
    phases = {"wall": 28.0, "warmup": 7.0, "measured_steps": 12.0, "real_batches": 2.0}
    probe = _probed({**phases, "peak_flops": 1.0, "subnormals": 1.0}, peak_gib=7.0)
    saving = dataclasses.replace(SPEC, parameters=10**8)
    disk = 2 * checkpoint_bytes(saving, probe.candidate) / SAVE_BYTES_PER_S
    assert checkpoint_bytes(saving, probe.candidate) == 10**8 * (4 + 8)  # fp32 + AdamW
    assert expected_s(probe, saving) == pytest.approx(12.0 + 7.0 + disk)
    evaluating = dataclasses.replace(saving, base_arguments={"eval_strategy": "steps"})
    assert expected_s(probe, evaluating) == pytest.approx(12.0 + 7.0 + disk + 28.0)
    assert reserved_s([probe], saving, probe_s=20.0) == expected_s(probe, saving)
    assert reserved_s([], saving, probe_s=20.0) == 20.0
    only_model = dataclasses.replace(saving, base_arguments={"save_only_model": True})
    assert checkpoint_bytes(only_model, probe.candidate) == 10**8 * 4


def test_a_save_whose_whole_checkpoint_fits_beside_the_peak_is_not_rehearsed() -> None:
    """A run that does not evaluate adds at most its checkpoint to the training's peak:
    a LoRA adapter's few megabytes beside a 1 GiB peak under 8 GiB need no rehearsal,
    and exploring leaves it no time. Full weights and AdamW state that would not fit
    beside the peak, an evaluation, or a Trainer that saves in its own way are
    rehearsed."""
    probe = _probed({"wall": 27.0, "warmup": 7.0, "measured_steps": 12.0})
    adapter = dataclasses.replace(SPEC, parameters=10**6)
    assert "its whole checkpoint (11 MiB: the most a save or a resume adds)" in checkpoint_room(
        probe, adapter
    )
    assert reserved_s([probe], adapter, probe_s=20.0) == 0.0
    full = dataclasses.replace(SPEC, parameters=10**9)  # 12 GB saved beside 1 GiB
    assert checkpoint_room(probe, full) == ""
    assert reserved_s([probe], full, probe_s=20.0) == expected_s(probe, full)
    evaluating = dataclasses.replace(adapter, base_arguments={"eval_strategy": "steps"})
    assert checkpoint_room(probe, evaluating) == ""
    gathering = dataclasses.replace(adapter, job_profile={"own_save": "Gathering._save"})
    assert checkpoint_room(probe, gathering) == ""
    # A LoRA adapter on a 2 GB bf16 base saves the adapter alone; frozen layers of a
    # model without one are saved with it.
    held = dataclasses.replace(
        SPEC, parameters=10**9, trainable_parameters=10**6, frozen_bytes=2 * 10**9
    )
    lora = dataclasses.replace(held, model=dataclasses.replace(SPEC.model, adapter={"r": 8}))
    assert checkpoint_bytes(lora, probe.candidate) == 10**6 * (4 + 8)
    assert "its whole checkpoint (11 MiB" in checkpoint_room(probe, lora)
    assert checkpoint_bytes(held, probe.candidate) == 2 * 10**9 + 10**6 * (4 + 8)


def test_a_rehearsal_its_time_limit_ends_is_cut_and_no_config_would_pass() -> None:
    """An event the trial's time limit stopped neither fits nor ran out of memory: said
    as cut, with the limit and what fit before it. A pass over their evaluation set
    takes as long whatever the config: the job's failure, with its fix."""
    train = Event("train", "ok", 2**30)
    cut = Rehearsal(
        (train, Event("save", "ok", 2**30), Event("resume", "cut", reason="--trial-timeout (9 s)"))
    )
    assert cut.describe() == (
        "rehearsal: cut at resume by --trial-timeout (9 s) (train 1.00 GiB; save 1.00 GiB fit)"
    )
    assert not cut.blocks_export and not cut.passed and not cut.clears and cut.failed is None
    assert cut.job_level and cut.fix().startswith("raise --trial-timeout")


@dataclasses.dataclass(frozen=True)
class _Config:  # what a rehearsal child is handed, as far as _run reads it
    trial_dir: str
    rehearsal: dict[str, object] | None = None


def test_a_rehearsal_runs_under_the_trials_limit_not_what_is_left_of_the_budget(
    tmp_path: Path,
) -> None:
    """The child wrote that the train and save events ended and the resume started, then
    was killed at its timeout: the trial's own, never the few seconds the budget had
    left (a rehearsal the budget cut let an unrehearsed config be exported)."""
    from autotune.core.enums import Outcome
    from autotune.core.rehearsal import EVENTS_NAME
    from autotune.core.trial import TrialResult
    from autotune.tuning.rehearsal import _run

    events = [
        {"event": "train", "state": "start"},
        {"event": "train", "state": "end", "peak_bytes": 2**30},
        {"event": "save", "state": "start"},
        {"event": "save", "state": "end", "peak_bytes": 2**30},
        {"event": "resume", "state": "start"},
    ]
    timeouts: list[float] = []

    def launched(config: _Config, timeout_s: float) -> TrialResult:
        timeouts.append(timeout_s)
        (tmp_path / EVENTS_NAME).write_text("".join(json.dumps(e) + "\n" for e in events))
        return TrialResult(
            Outcome.TIMEOUT, reason=f"timeout after {timeout_s:.0f} s", phases_s={"wall": 9.5}
        )

    run = types.SimpleNamespace(
        limits=SearchLimits(trial_timeout_s=9.0),
        launcher=types.SimpleNamespace(run=launched),
        trial_config=lambda *args, **kwargs: _Config(str(tmp_path)),
    )
    saving = RunEvents.of(SPEC)
    fields = {**saving.fields, "per_device_eval_batch_size": 8}
    found, _ = _run(run, rec(0, cand(8)), saving, fields)  # type: ignore[arg-type]
    assert timeouts == [9.0]
    assert [e.outcome for e in found.events] == ["ok", "not reached", "ok", "cut"]
    assert found.describe().startswith("rehearsal: cut at resume by --trial-timeout (9 s)")
    assert found.seconds == 9.5


def _evaluating(tmp_path: Path, pile: float) -> tuple[types.SimpleNamespace, list[int]]:
    """A run whose evaluation keeps its logits, over a child whose peak at each tenth of
    the pass is the training's half of the limit, `pile` of it more over the whole pass
    (the logits kept) and 0.3 of it at batch 64 (one batch's forward, halved with the
    batch): it dies at the first mark over the limit. Returns the run and the batches
    each child evaluated at."""
    from autotune.core.enums import Outcome
    from autotune.core.rehearsal import EVENTS_NAME
    from autotune.core.trial import TrialResult

    arguments = {"eval_strategy": "steps", "per_device_eval_batch_size": 64}
    spec = dataclasses.replace(SPEC, base_arguments=arguments, memory_budget_bytes=2**30)
    limit = spec.fit_limit_bytes
    batches: list[int] = []

    def launched(config: _Config, timeout_s: float) -> TrialResult:
        batch = int(config.rehearsal["fields"]["per_device_eval_batch_size"])  # type: ignore[index]
        batches.append(batch)
        events = [{"logits_kept": True}, {"event": "evaluation", "state": "start"}]
        outcome = Outcome.OK
        for tenth in range(1, 11):
            peak = int(limit * (0.5 + pile * tenth / 10 + 0.3 * batch / 64))
            if peak > limit:
                outcome = Outcome.OOM
                break
            events.append(
                {"event": "evaluation", "state": "progress", "done": tenth / 10, "peak_bytes": peak}
            )
        if outcome == Outcome.OK:
            events.append({"event": "evaluation", "state": "end", "peak_bytes": peak})
        (tmp_path / EVENTS_NAME).write_text("".join(json.dumps(e) + "\n" for e in events))
        return TrialResult(outcome, peak_memory_bytes=limit)

    run = types.SimpleNamespace(
        spec=spec,
        limits=SearchLimits(),
        launcher=types.SimpleNamespace(run=launched),
        trial_config=lambda *args, **kwargs: _Config(str(tmp_path)),
    )
    return run, batches


def test_logits_that_pile_past_the_budget_stop_the_halving_at_the_first_pass_that_shows_it(
    tmp_path: Path,
) -> None:
    """Their pass at batch 64 dies 30% of the way through, its logits growing by 0.9 of
    the limit a pass: it would end at 1.7x the limit, and at 1.4x at any smaller batch.
    Each try is a pass over their evaluation set: none is spent on halves that cannot
    fit."""
    from autotune.tuning.rehearsal import rehearse

    run, batches = _evaluating(tmp_path, pile=0.9)
    events = RunEvents.of(run.spec)
    found = rehearse(run, rec(0, cand(8)), events)  # type: ignore[arg-type]
    assert batches == [64]
    assert found.hopeless and found.blocks_export
    assert "out of memory with evaluation batch 64: the logits your compute_metrics keeps " in (
        found.note
    )
    assert "whatever the batch (its pass would end at about" in found.note


def test_a_pass_that_ends_near_the_budget_still_halves_to_a_batch_that_fits(
    tmp_path: Path,
) -> None:
    """The logits grow by a quarter of the limit a pass: at batch 64, one batch's forward
    takes the pass over the limit after 80% of it, near enough that half the
    batch may fit, and it does."""
    from autotune.tuning.rehearsal import rehearse

    run, batches = _evaluating(tmp_path, pile=0.25)
    events = RunEvents.of(run.spec)
    found = rehearse(run, rec(0, cand(8)), events)  # type: ignore[arg-type]
    assert batches == [64, 32]
    assert found.passed and found.tuned and found.eval_batch == 32
    assert found.note == "out of memory with evaluation batch 64"
