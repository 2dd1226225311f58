"""Export: the winner as TrainingArguments JSON (verified), and a sidecar with the figures.

The arguments file holds only TrainingArguments fields, so any HfArgumentParser-based
script reads it unchanged; everything else (figures, versions, budget) goes to the
sidecar `<name>.summary.json`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.core.enums import Objective, Task
from autotune.core.errors import ExportError
from autotune.core.files import read_json, write_all_atomic
from autotune.core.parity import Arithmetic, changes
from autotune.core.parity_state import ParityState
from autotune.core.run_events import RunEvents, required
from autotune.core.spec import SearchSpec
from autotune.core.subnormals import worth_flushing
from autotune.core.trial import Candidate, TrialRecord, TrialResult
from autotune.hf.training_args import TUNED, merge, recipe, training_fields
from autotune.hf.training_args import validate as check
from autotune.tuning.parity import reference_for
from autotune.tuning.rehearsal import failure_error, job_failure
from autotune.tuning.selection import (
    fitting,
    kept_note,
    ranked,
    select_export,
    unverified_note,
)


def sidecar_path(output: Path) -> Path:
    return output.with_name(output.stem + ".summary.json")


SQLITE_HEADER = b"SQLite format 3\x00"


def previous_export(output: Path, *, force: bool) -> dict[str, Any]:
    """The fields of an existing `output` that a new export keeps, after checking that it
    may be replaced: of a file autotune wrote (its sidecar says so), the fields the user
    added (not those an earlier export wrote: what is exported is what was measured);
    any other file is refused unless `force`; a database never is."""
    if not output.exists():
        return {}
    where = output.resolve()
    if not where.is_file() or where.read_bytes()[:16] == SQLITE_HEADER:
        raise ExportError(
            f"{output} is a database or not a plain file; autotune never "
            "writes an export over it: choose another --output"
        )
    try:
        sidecar, existing = read_json(sidecar_path(output)), read_json(where)
    except (OSError, ValueError):
        sidecar = existing = None
    ours = isinstance(sidecar, dict) and {"study", "best"} <= set(sidecar)
    if ours and isinstance(existing, dict):
        written = sidecar.get("arguments")
        if not isinstance(written, dict):  # a sidecar from before it listed them
            written = {k: v for k, v in existing.items() if k in TUNED}
        theirs = sidecar.get("your_arguments") or {}
        if isinstance(theirs, dict):  # else not a sidecar autotune wrote: refused below
            return {k: v for k, v in existing.items() if k not in {**written, **theirs}}
    if not force:
        raise ExportError(
            f"{output} exists and was not written by autotune; choose another "
            "--output, or pass --force to replace it"
        )
    return {}


def export_best(
    *,
    record: TrialRecord,
    spec: SearchSpec,
    study_name: str,
    output: Path,
    runners_up: list[TrialRecord],
    objective: Objective,
    validate: bool,
    force: bool = False,
    parity: ParityState | None = None,
    all_records: Sequence[TrialRecord] = (),
    rehearse: bool = True,
) -> Path:
    """Write the arguments JSON and its sidecar atomically; returns the arguments path.

    The arguments are exactly what the probe ran (`recipe`). `validate` parses them with
    HfArgumentParser first (the search does, with transformers loaded); `autotune export`
    writes what the probe already ran, without importing transformers."""
    arguments = exported_arguments(spec, record)
    kept = previous_export(output, force=force)
    # the user's own run (output_dir, max_steps, ...) and what they added to an earlier
    # export stay
    exported = merge({**spec.kept_arguments, **kept}, arguments)
    if validate:
        args_class = spec.model.args_class  # the user's (SFTConfig stays SFTConfig)
        known = training_fields(args_class)
        fields = {k: v for k, v in exported.items() if k in known}
        check(
            fields,
            error=ExportError,
            where="the best config on this machine",
            args_class=args_class,
        )
    summary = {
        **_summary(record, spec, study_name, runners_up, objective),
        "parity": parity_summary(record, spec, all_records, parity, rehearse=rehearse),
        "arguments": arguments,
        "your_arguments": spec.kept_arguments,  # written back from --base-args
        "model_arguments": record.candidate.model_arguments(),
        "script_changes": run_changes(record, spec),
    }
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        note = json.dumps(summary, indent=2, sort_keys=True) + "\n"
        # Together: an arguments file is never left without the note that says autotune
        # wrote it (and which fields it wrote), nor beside another export's note.
        text = json.dumps(exported, indent=2, sort_keys=True) + "\n"
        write_all_atomic({sidecar_path(output): note, output: text})
    except OSError as exc:
        raise ExportError(
            f"cannot write {output}: {exc.strerror or exc}; free disk space or fix the "
            "permissions, then run `autotune export` (the study is kept)"
        ) from None
    return output


def export_selected(
    *,
    records: list[TrialRecord],
    spec: SearchSpec,
    study_name: str,
    output: Path,
    objective: Objective,
    validate: bool,
    force: bool = False,
    parity: ParityState | None = None,
    rehearse: bool = True,
) -> TrialRecord | None:
    """Select the best of a study's records that its rehearsal cleared (`rehearse`:
    where the run evaluates or saves; False: searched with --no-rehearse) and export it;
    None when nothing does. NoFitError, its fix last, where a rehearsal failed in a way
    no config changes (none is exported)."""
    if required(spec, rehearse) and (failed := job_failure(records)) is not None:
        raise failure_error(failed)
    best = select_export(spec, records, objective, rehearse=rehearse)
    if best is None:
        return None
    others = [r for r in ranked(fitting(records, spec.fit_limit_bytes)) if r != best][:3]
    export_best(
        record=best,
        spec=spec,
        study_name=study_name,
        output=output,
        runners_up=others,
        objective=objective,
        validate=validate,
        force=force,
        parity=parity,
        all_records=records,
        rehearse=rehearse,
    )
    return best


def parity_summary(
    record: TrialRecord,
    spec: SearchSpec,
    records: Sequence[TrialRecord],
    state: ParityState | None,
    *,
    rehearse: bool = True,
) -> dict[str, Any]:
    """What the exported config changes against the user's recipe, split into what keeps
    the arithmetic of training and what alters it, with the parity verdict on the latter,
    why a change parity did not verify was exported anyway (its significant gain), and
    its rehearsal (or the one reason it has none)."""
    reference = reference_for(spec, records, state)
    found = changes(reference, record.candidate)
    parity = record.parity
    return {
        "reference": reference.describe(),
        "keeps_arithmetic": [c.describe() for c in found if c.keeps_arithmetic],
        "alters_arithmetic": [c.describe() for c in found if not c.keeps_arithmetic],
        "status": str(parity.status) if parity else "unchecked",
        "verdict": parity.figures() if parity else unchecked(spec, records, state),
        "unverified_gain": unverified_note(spec, records, record),
        "kept_arithmetic": kept_note(spec, records, record),
        "tolerance": state.tolerance.describe() if state and state.tolerance else None,
        "steps": state.steps if state else None,
        "rehearsal": rehearsal_line(record, spec, rehearse=rehearse),
    }


def rehearsal_line(record: TrialRecord, spec: SearchSpec, *, rehearse: bool) -> str:
    """The config's rehearsal, or the one reason it has none."""
    if record.rehearsal is not None:
        return record.rehearsal.describe()
    if not RunEvents.of(spec).any:
        return "rehearsal: not needed: your run neither evaluates nor saves checkpoints"
    if not rehearse:
        return "rehearsal: skipped (--no-rehearse): not checked against your evaluation and saves"
    return "rehearsal: not run yet for this config (none is exported before it is)"


def exported_arguments(spec: SearchSpec, record: TrialRecord) -> dict[str, Any]:
    """What the export writes for `record` (before the user's own fields are kept):
    what its probe ran, and the evaluation settings its rehearsal tuned."""
    tuned = record.rehearsal.exported_fields() if record.rehearsal else {}
    return {**recipe(spec, record.candidate), **tuned}


NOT_CHECKED = "training parity not checked (searched with --parity off)"


def unchecked(spec: SearchSpec, records: Sequence[TrialRecord], state: ParityState | None) -> str:
    """Why a config's training parity has no verdict: parity off (the study holds no
    parity state), no probe of the recipe's arithmetic that fit to compare with, or no
    run of its own arithmetic judged in time."""
    if state is None:
        return NOT_CHECKED
    recipe = Arithmetic.of(state.reference)
    if not any(
        Arithmetic.of(r.candidate) == recipe for r in fitting(records, spec.fit_limit_bytes)
    ):
        return (
            "training parity not checked: no config of your recipe's arithmetic "
            f"({recipe.precision}, {recipe.optimizer}) fit, so none ran to compare with"
        )
    return (
        "training parity not checked: this search judged no probe or run of its "
        "arithmetic against your recipe's"
    )


def written_script_changes(output: Path) -> list[str]:
    """The script lines an export's sidecar lists (none for a sidecar from before)."""
    path = sidecar_path(output)
    try:
        summary = read_json(path)
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read {path}: {exc}") from None
    lines = summary.get("script_changes", []) if isinstance(summary, dict) else None
    if not isinstance(lines, list):
        raise ExportError(f"{path} is not an export's summary: export again to rewrite it")
    return [str(line) for line in lines]


def script_changes(candidate: Candidate, *, factory: bool = False) -> list[str]:
    """The lines the user's script needs besides the arguments file, as measured: none
    for a lever their factory's arguments class turns on itself (the file sets it)."""
    return [
        line
        for lever, value in candidate.levers
        if not (factory and lever.class_fields(value))
        for line in lever.script_lines(value)
    ]


def run_changes(record: TrialRecord, spec: SearchSpec) -> list[str]:
    """What the user's script and run need besides the arguments file: the levers'
    lines; where its rows are packed, the run length that trains their samples; where
    it makes subnormal numbers on a CPU slow on them, their flush."""
    lines = script_changes(record.candidate, factory=bool(spec.model.trainer))
    trained = record.result.samples_per_step
    if record.candidate.levers.changes_samples and trained:
        batch = spec.global_batch_size
        steps = int(spec.kept_arguments.get("max_steps") or 0)
        length = (
            f"; your max_steps {steps} would train {trained / batch:.1f}x the samples, "
            f"max_steps {max(1, round(steps * batch / trained))} as many"
            if steps > 0
            else ""
        )
        lines.append(
            f"packed rows: a step trains about {trained:.0f} of your samples, {batch} a "
            f"step of your recipe's{length}; set warm-up and learning rate for fewer, "
            "fuller steps"
        )
    return lines + flush_lines(record.result, stand_in=not spec.model.trainer)


def flush_lines(result: TrialResult, *, stand_in: bool) -> list[str]:
    """The flush of subnormal numbers, where the probe found its job making them on a CPU
    that pays for them (core/subnormals.py). A probe cannot flush for the user: their
    script would not, so the speeds measured include the cost."""
    share, slowdown = result.subnormal_share, result.subnormal_slowdown
    if share is None or slowdown is None or not worth_flushing(share, slowdown):
        return []
    made = "; the stand-in's random weights made them, your checkpoint may not" if stand_in else ""
    return [
        f"torch.set_flush_denormal(True) at its start: {share:.0%} of the optimizer's state "
        "was subnormal (too small for a normal float) after the probe's steps, numbers "
        f"this CPU multiplies {slowdown:.1f}x slower{made}; the speeds here include what "
        "the first steps paid, and a longer run can pay more. Flushed, such numbers read "
        "and are written as zero; this job's flushed speed and losses were not measured"
    ]


def _figures(record: TrialRecord) -> dict[str, Any]:
    r = record.result
    return {
        "trial": record.number,
        "config": record.candidate.describe(),
        "samples_per_s": r.samples_per_s,
        "tokens_per_s": r.tokens_per_s,
        "step_time_median_s": r.step_time_median_s,
        "step_time_spread": r.step_time_spread,
        "peak_memory_bytes": r.peak_memory_bytes,
        "model_flops_per_s": r.model_flops_per_s,
        "peak_flops_per_s": r.peak_flops_per_s,
        "mfu": r.mfu,
        "mfu_unknown": r.mfu_unknown,
        "worst_case_samples_per_s": r.worst_case_samples_per_s,
        "padding_fraction": r.padding_fraction,
        "one_time_s": r.one_time_s,
        "runs": record.runs,
        "measured_steps": len(r.step_times_s),
    }


def launch_line(nproc_per_node: int, nnodes: int = 1) -> str:
    """How to run the user's script with the exported JSON, as it was probed: across
    nodes, the same line on each (HEAD_ADDR: the first node's address every node reaches;
    under Slurm, `srun` starts it on every node)."""
    if nnodes > 1:
        return (
            f"torchrun --nnodes {nnodes} --nproc-per-node {nproc_per_node} --rdzv-backend c10d "
            "--rdzv-endpoint HEAD_ADDR:29400 --rdzv-id autotune your_script.py ARGS.json"
        )
    if nproc_per_node > 1:
        return f"torchrun --nproc-per-node {nproc_per_node} your_script.py ARGS.json"
    return "python your_script.py ARGS.json"


def srun_line(nproc_per_node: int, nnodes: int) -> str:
    """The line a Slurm job runs the user's script across its nodes with: torchrun on
    every node, the job's first node hosting the rendezvous."""
    head = "$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)"
    return (
        f"srun --nodes {nnodes} --ntasks-per-node 1 bash -c 'torchrun --nnodes {nnodes} "
        f"--nproc-per-node {nproc_per_node} --rdzv-backend c10d --rdzv-endpoint {head}:29400 "
        "--rdzv-id $SLURM_JOB_ID your_script.py ARGS.json'"
    )


def _summary(
    record: TrialRecord,
    spec: SearchSpec,
    study_name: str,
    runners_up: list[TrialRecord],
    objective: Objective,
) -> dict[str, Any]:
    return {
        "study": study_name,
        "objective": objective,
        "model": spec.model.name,
        "model_source": spec.model.source,
        "task": spec.model.task,
        "device": {"kind": spec.device.kind, "name": spec.device.name},
        "memory_budget_bytes": spec.memory_budget_bytes,
        "fit_limit_bytes": spec.fit_limit_bytes,
        "global_batch_size": spec.global_batch_size,
        "nproc_per_node": spec.nproc_per_node,
        "nnodes": spec.nnodes,
        "launch": launch_line(spec.nproc_per_node, spec.nnodes),
        "launch_srun": srun_line(spec.nproc_per_node, spec.nnodes) if spec.nnodes > 1 else None,
        "seq_len": spec.seq_len,
        "target_len": spec.target_len if spec.model.task == Task.SEQ2SEQ else None,
        "probe_steps": {"warmup": spec.warmup_steps, "measured": spec.measure_steps},
        "train_steps": spec.train_steps or None,
        "time_to_finish_s": record.result.time_to_finish_s(spec.train_steps)
        if spec.train_steps
        else None,
        "levers_not_offered": dict(spec.space.not_offered),
        "data": spec.data.summary() if spec.data else None,
        "best": _figures(record),
        "runners_up": [_figures(r) for r in runners_up],
        "versions": record.result.versions,
    }
