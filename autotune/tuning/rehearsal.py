"""Before a config is exported it rehearses the user's run's other memory events
(core/rehearsal.py) under the same budget, in its own process: their evaluation and
their checkpoint save, then a resume. No config is exported unrehearsed where the run
evaluates or saves (`core/run_events.required`): the rehearsal does not yield to the
clock; where exploring left it too little time it runs past the budget, and says by
how much. A config that runs out of memory is not exported (the next selected is
rehearsed, up to `REHEARSALS`); the search says which event failed at what peak.

Checks first: where the run evaluates, the first config that fits is rehearsed at once,
while exploring, so a failure no training config can fix (the kept logits piling up
whatever the evaluation batch; an evaluation or save that raises; a pass longer than
the trial's limit) stops the search then, with its fix (`job_failure`), not after the
budget's exploring.

The evaluation batch is tuned here: the user's `per_device_eval_batch_size` and
`eval_accumulation_steps` where they fit; else, where the Trainer keeps the logits
(their `compute_metrics`) on a GPU, accumulation that moves them off the device each
step, then half the batch at a time, down to an eighth, until one fits or the kept
logits are seen to pile up past the budget whatever the batch (the peak's growth with
the batches done, carried to the end of the pass: each try is a pass over their
evaluation set, and in a real run one pass may take minutes). The batch found to fit is
where every later rehearsal starts. Evaluation settings do not change the training's
arithmetic: no parity run is needed, and the tuned ones are exported with the config.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.core.enums import DeviceKind, Outcome
from autotune.core.errors import NoFitError
from autotune.core.files import parse_json
from autotune.core.rehearsal import EVENTS_NAME, Event, Rehearsal, read_events
from autotune.core.run_events import RunEvents
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialRecord
from autotune.core.units import format_duration, format_size
from autotune.tuning._context import RunContext
from autotune.tuning.deadline import Deadline
from autotune.tuning.estimate import state_bytes
from autotune.tuning.selection import select_for

REHEARSALS = 3  # configs rehearsed at most before the export, the selected first
DEFAULT_EVAL_BATCH = 8  # TrainingArguments' per_device_eval_batch_size
STAND_IN_EVAL_BATCHES = 2  # a stand-in's synthetic evaluation set, in batches
HALVINGS = 3  # evaluation batches tried below the user's: half, a quarter, an eighth
# A checkpoint written and read back, planned at a modest local disk's speed: on this
# CPU host mt5-small's rehearsal (3.6 GB of weights and AdamW state saved, then resumed)
# took 15 s whole; a NeoX-style 10M-parameter model's 5 s
SAVE_BYTES_PER_S = 512 * 2**20
# An evaluation out of memory this far through its batches: the kept logits piling up
LATE = 0.5
# An evaluation whose pass would end this far over the limit: a smaller batch, which
# lowers one batch's share of the peak and not the logits kept, cannot bring it under
PAST = 1.10


def plan_line(spec: SearchSpec, *, rehearse: bool = True) -> str:
    """The search's first lines: what the rehearsal will run before the export."""
    run = RunEvents.of(spec)
    if not run.any:
        return "rehearsal: none (your run neither evaluates nor saves checkpoints)"
    if not rehearse:
        return (
            "rehearsal: off (--no-rehearse): the export is not checked against your run's "
            "evaluation and checkpoint saves"
        )
    what = " and ".join(
        w
        for w, on in (("your evaluation", run.evaluate), ("a checkpoint save and resume", run.save))
        if on
    )
    skipped = "".join(f"; no {why}" for why in run.why_not)
    first = (
        "; the first config that fits runs it at once, so what no config can fix stops the "
        "search there"
        if run.evaluate
        else ""
    )
    return (
        f"rehearsal: before the export, the config to export runs {what} under the budget, "
        "in time reserved from exploring (past the budget where that is short, said): none "
        f"is exported without it{first}{skipped}"
    )


def rehearse_first(run: RunContext, records: Sequence[TrialRecord], deadline: Deadline) -> bool:
    """Where the run evaluates and nothing in the study was rehearsed yet, rehearse the
    config selection would export now (the first that fits), before exploring on: a
    failure no config can fix is known after one rehearsal, and the evaluation batch it
    finds to fit is where later rehearsals start. Returns whether it rehearsed."""
    events = RunEvents.of(run.spec)
    if not run.limits.rehearse or not events.evaluate:
        return False
    if any(r.rehearsal is not None for r in records):
        return False
    chosen = select_for(run.spec, records, run.limits.objective)
    if chosen is None:
        return False
    run.observer.on_plan(
        f"rehearsal: trial {chosen.number}, the first config that fits, runs your "
        "evaluation now: what fails whatever the config is known before exploring on"
    )
    _rehearse_and_say(run, chosen, events, deadline, records)
    return True


def rehearse_selected(run: RunContext, deadline: Deadline) -> None:
    """Rehearse the config selection would export, however little of the time budget is
    left (said, with the overrun); one that runs out of memory is out, and the next
    selected is rehearsed, up to `REHEARSALS`. Raises NoFitError, with the fix, where a
    rehearsal failed in a way no config changes."""
    events = RunEvents.of(run.spec)
    if not events.any:
        return
    for _ in range(REHEARSALS):
        records = run.store.records()
        if (failed := job_failure(records)) is not None:
            raise failure_error(failed)
        chosen = select_for(run.spec, records, run.limits.objective)
        if chosen is None or (chosen.rehearsal is not None and chosen.rehearsal.clears):
            return
        if bound := checkpoint_room(chosen, run.spec):
            unneeded = Rehearsal((), unneeded=bound)
            run.store.settings.save_rehearsal(chosen.number, unneeded)
            run.observer.on_plan(f"trial {chosen.number}: {unneeded.describe()}")
            return
        found = _rehearse_and_say(run, chosen, events, deadline, records)
        if found.job_level:
            raise failure_error(dataclasses.replace(chosen, rehearsal=found))
        if found.passed:
            return


def job_failure(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """A trial whose rehearsal failed in a way no training config changes, if any, while
    no config's passed: what a pass holds at its start is the config's, so near the
    limit a leaner config may still fit where one read as hopeless did not."""
    if any(r.rehearsal is not None and r.rehearsal.passed for r in records):
        return None
    return next((r for r in records if r.rehearsal is not None and r.rehearsal.job_level), None)


def failure_error(record: TrialRecord) -> NoFitError:
    """The one-line error of a job-level rehearsal failure, its fix last."""
    found = record.rehearsal
    assert found is not None  # job_failure's
    fix = found.fix()
    return NoFitError(
        f"trial {record.number} trains within the budget, but its {found.describe()}"
        + (f"; {fix}" if fix else "")
    )


def _rehearse_and_say(
    run: RunContext,
    record: TrialRecord,
    events: RunEvents,
    deadline: Deadline,
    records: Sequence[TrialRecord],
) -> Rehearsal:
    """Rehearse `record`, keep it in the study and say it in one line; where the time
    left is shorter than the rehearsal, say first that it runs past the budget, and
    after, by how much it did."""
    left = deadline.left()
    planned = rehearsal_s(records, run.spec, record)
    if left is not None and planned > left:
        run.observer.on_plan(
            f"rehearsal: trial {record.number}'s takes about {format_duration(planned)} and "
            f"{format_duration(left)} of the time budget is left: it runs past the budget "
            "(no config is exported unrehearsed)"
        )
    found = rehearse(run, record, events, records)
    run.store.settings.save_rehearsal(record.number, found)
    over = deadline.over()
    past = f" ({format_duration(over)} past the time budget)" if over >= 1.0 else ""
    run.observer.on_plan(f"trial {record.number}: {found.describe()}{past}")
    return found


def expected_s(record: TrialRecord, spec: SearchSpec) -> float:
    """What rehearsing `record` takes: its probe less what it timed (a child, the
    imports, the job built, its first steps), the resume's new Trainer and first steps
    again (the probe's warm-up, which holds the build where the user's factory builds
    their model again), and the checkpoint written and read back. Where the run
    evaluates, its evaluation pass over data of unknown size is planned at a whole
    probe's time on top of that. (A 1-minute QLoRA search on an H100 planned its
    rehearsal at the imports alone, 4 s, and the budget cut it at the resume.)"""
    phases = record.result.phases_s
    wall = phases.get("wall", 0.0) or phases.get("total", 0.0)
    measured_only = ("measured_steps", "real_batches", "peak_flops", "subnormals")
    timed = sum(phases.get(k, 0.0) for k in measured_only)
    warmup = phases.get("warmup", 2 * (record.result.step_time_median_s or 0.0))
    save = 2 * checkpoint_bytes(spec, record.candidate) / SAVE_BYTES_PER_S
    evaluation = wall if RunEvents.of(spec).evaluate else 0.0
    return max(0.0, wall - timed) + warmup + save + evaluation


def checkpoint_room(record: TrialRecord, spec: SearchSpec) -> str:
    """Why `record` needs no rehearsal ("" where it does): a run that does not evaluate
    adds at most its whole checkpoint to the training's peak (a save serializes it, a
    resume loads it back beside the fresh state), and the measured peak leaves that
    room within the budget, as it does for a LoRA adapter's few megabytes. Where their
    Trainer class saves or loads in its own way, it is rehearsed."""
    peak = record.result.peak_memory_bytes
    if RunEvents.of(spec).evaluate or peak is None or spec.job_profile.get("own_save"):
        return ""  # their Trainer's own save may hold anything: it is rehearsed
    saved = checkpoint_bytes(spec, record.candidate)
    if peak + saved > spec.fit_limit_bytes:
        return ""
    return (
        f"its measured peak ({format_size(peak)}) and its whole checkpoint "
        f"({format_size(saved)}: the most a save or a resume adds) fit the budget "
        f"({format_size(spec.fit_limit_bytes)})"
    )


def checkpoint_bytes(spec: SearchSpec, candidate: Candidate) -> int:
    """What a checkpoint holds: the weights as held (the trained ones in 32 bits) and,
    unless the run saves the model only, the optimizer's state for those that train. A
    PEFT adapter's checkpoint holds the adapter alone (`PeftModel.save_pretrained`, which
    the Trainer's save calls): the frozen base is neither written nor read back."""
    trained = spec.trainable_parameters or spec.parameters
    frozen = spec.frozen_bytes if spec.trainable_parameters and not spec.model.adapter else 0
    only_model = RunEvents.of(spec).fields.get("save_only_model") is True
    return trained * 4 + frozen + (0 if only_model else trained * state_bytes(candidate.optim))


def reserved_s(records: Sequence[TrialRecord], spec: SearchSpec, probe_s: float) -> float:
    """The time exploring leaves the rehearsal before the export: the longest rehearsal
    this study ran that passed (as measured, at the evaluation batch later ones start
    from); before any, the median of what the configs that fit so far would take (a
    probe's time, `probe_s`, before any fits)."""
    if (measured := _measured_s(records)) is not None:
        return measured
    fitting = [
        0.0 if checkpoint_room(r, spec) else expected_s(r, spec)
        for r in records
        if r.result.outcome == Outcome.OK
    ]
    return statistics.median(fitting) if fitting else probe_s


def rehearsal_s(records: Sequence[TrialRecord], spec: SearchSpec, record: TrialRecord) -> float:
    """What rehearsing `record` is expected to take: as this study's rehearsals took,
    else as its probe shows (`expected_s`)."""
    measured = _measured_s(records)
    return measured if measured is not None else expected_s(record, spec)


def _measured_s(records: Sequence[TrialRecord]) -> float | None:
    runs = [
        r.rehearsal.seconds
        for r in records
        if r.rehearsal is not None and r.rehearsal.passed and r.rehearsal.seconds
    ]
    return max(runs) if runs else None


def rehearse(
    run: RunContext, record: TrialRecord, events: RunEvents, records: Sequence[TrialRecord] = ()
) -> Rehearsal:
    """Rehearse `record`; where its evaluation runs out of memory, tune the evaluation
    batch: on a GPU, where the Trainer keeps the logits, accumulation that moves them to
    the host each step; then the largest of half the user's batch, a quarter, an eighth
    that fits. Where none does and the evaluation failed late in its pass with logits
    kept, they pile up whatever the batch: `hopeless`, and said what would fit. It starts
    at the evaluation settings an earlier rehearsal of the study (`records`) found to
    fit, where theirs did not."""
    theirs = int(events.fields.get("per_device_eval_batch_size", DEFAULT_EVAL_BATCH))
    their_accumulation = events.fields.get("eval_accumulation_steps")
    start, start_accumulation, found_by = _start(records, theirs, their_accumulation)
    tried: list[str] = []

    def attempt(batch: int, accumulation: Any) -> tuple[Rehearsal, bool]:
        fields = {**events.fields, "per_device_eval_batch_size": batch}
        if accumulation is not None:
            fields["eval_accumulation_steps"] = accumulation
        found, logits_kept = _run(run, record, events, fields)
        tuned = (batch, accumulation) != (theirs, their_accumulation)
        found = dataclasses.replace(
            found, eval_batch=batch, eval_accumulation=accumulation, tuned=tuned
        )
        if _evaluation_oom(found):
            tried.append(
                f"evaluation batch {batch}" + (f" x{accumulation}" if accumulation else "")
            )
        return found, logits_kept

    found, logits_kept = attempt(start, start_accumulation)
    if not _evaluation_oom(found):
        return dataclasses.replace(found, note=found_by) if found_by else found
    accumulation = start_accumulation
    if logits_kept and accumulation is None and run.spec.device.kind == DeviceKind.CUDA:
        accumulation = 1  # on the CPU the logits are in host memory already
        found, _ = attempt(start, accumulation)
        if not _evaluation_oom(found):
            return dataclasses.replace(found, note=_tried(tried))
    limit = run.spec.fit_limit_bytes
    for batch in (b for b in _halves(theirs) if b < start):  # the largest that fits
        if logits_kept and _piles_past(found, limit):
            break
        found, _ = attempt(batch, accumulation)
        if not _evaluation_oom(found):
            return dataclasses.replace(found, note=_tried(tried))
    return _none_fits(found, tried, logits_kept, limit)


def _start(
    records: Sequence[TrialRecord], theirs: int, their_accumulation: Any
) -> tuple[int, Any, str]:
    """Where a rehearsal starts: the largest evaluation batch an earlier rehearsal found
    to fit below theirs (and its accumulation), with the note that says so; else theirs."""
    found = [
        (r.rehearsal.eval_batch, -r.number, r.rehearsal)
        for r in records
        if r.rehearsal is not None
        and r.rehearsal.passed
        and r.rehearsal.tuned
        and r.rehearsal.eval_batch is not None
    ]
    if not found:
        return theirs, their_accumulation, ""
    batch, number, best = max(found, key=lambda f: (f[0], f[1]))
    accumulation = f" x{best.eval_accumulation}" if best.eval_accumulation else ""
    note = f"evaluation batch {batch}{accumulation}, found to fit by trial {-number}'s rehearsal"
    return int(batch or theirs), best.eval_accumulation, note


def _piles_past(found: Rehearsal, limit: int) -> bool:
    """The evaluation's pass would end `PAST` over the limit (its progress marks say):
    no smaller batch brings what it keeps under."""
    failed = found.failed
    end = failed.pass_end_bytes if failed is not None else None
    return end is not None and end > PAST * limit


def _none_fits(found: Rehearsal, tried: list[str], logits_kept: bool, limit: int) -> Rehearsal:
    """The rehearsal at the smallest batch tried, saying why none fit: where the logits
    kept would take the pass past the limit, or it failed late in the pass with logits
    kept, they pile up whatever the batch (`hopeless`)."""
    failed = found.failed
    past = logits_kept and _piles_past(found, limit)
    late = past or (logits_kept and failed is not None and (failed.done or 0.0) >= LATE)
    why = "a smaller batch than these might"
    if late:
        why = (
            "the logits your compute_metrics keeps pile up with the evaluation set, "
            "whatever the batch"
        )
    if past and failed is not None and failed.pass_end_bytes:
        why += (
            f" (its pass would end at about {format_size(failed.pass_end_bytes)}, over the "
            f"{format_size(limit)} it may use)"
        )
    advice = (
        "; set prediction_loss_only=true, or reduce the logits kept "
        "(preprocess_logits_for_metrics, e.g. an argmax)"
        if logits_kept
        else ""
    )
    return dataclasses.replace(found, hopeless=late, note=f"{_tried(tried)}: {why}{advice}")


def _halves(batch: int) -> list[int]:
    """Half the batch, a quarter, an eighth (at least 1; the largest first): an evaluation
    that fails at an eighth of its batch is not one batch's forward."""
    return sorted({max(1, batch // 2**k) for k in range(1, HALVINGS + 1)} - {batch}, reverse=True)


def _evaluation_oom(found: Rehearsal) -> bool:
    failed = found.failed
    return failed is not None and failed.name == "evaluation" and failed.outcome == "oom"


def _run(
    run: RunContext, record: TrialRecord, events: RunEvents, fields: dict[str, Any]
) -> tuple[Rehearsal, bool]:
    """One rehearsal child, under the trial's own time limit (not the budget's: no
    config is exported unrehearsed): its events, and whether the Trainer kept the
    logits. An event the limit ended is cut, said with the limit."""
    batch = int(fields["per_device_eval_batch_size"])
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{batch}"
    config = run.trial_config(
        record.number, record.candidate, f"{record.number}-rehearsal-{stamp}", concurrent=1
    )
    plan = {
        "evaluate": events.evaluate,
        "save": events.save,
        "fields": fields,
        "eval_samples": STAND_IN_EVAL_BATCHES * batch,
    }
    config = dataclasses.replace(config, rehearsal=plan)
    timeout = run.limits.trial_timeout_s
    started = time.monotonic()
    result = run.launcher.run(config, timeout_s=timeout)
    seconds = round(result.phases_s.get("wall") or time.monotonic() - started, 3)
    text = _read(Path(config.trial_dir) / EVENTS_NAME)
    failure = {Outcome.OOM: "oom", Outcome.TIMEOUT: "cut"}.get(result.outcome, "error")
    reason = f"--trial-timeout ({timeout:.0f} s)" if failure == "cut" else result.reason
    found = read_events(text, failure=failure, peak_bytes=result.peak_memory_bytes, reason=reason)
    if result.outcome != Outcome.OK and not any(
        e.outcome in ("oom", "error", "cut") for e in found
    ):
        # failed before any event (building the job or its model): said on the first
        why = "" if failure == "oom" else reason
        found = (Event("train", failure, result.peak_memory_bytes, why), *found[1:])
    return Rehearsal(found, seconds=seconds), _logits_kept(text)


def _logits_kept(text: str) -> bool:
    """Whether the child's Trainer keeps every evaluation batch's logits (a
    compute_metrics, and not prediction_loss_only)."""
    for line in text.splitlines():
        try:
            raw = parse_json(line)
        except ValueError:
            continue  # a line cut short by the process dying
        if isinstance(raw, dict) and raw.get("logits_kept"):
            return True
    return False


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def _tried(tried: list[str]) -> str:
    return f"out of memory with {'; '.join(tried)}" if tried else ""
