"""The library functions behind each command: keyword-only, returning data; the views
print it and the CLI turns errors into one line and an exit code."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import ipaddress
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.core import checkpointing
from autotune.core.enums import DeviceKind, Objective
from autotune.core.errors import ExportError, NoFitError
from autotune.core.files import write_atomic
from autotune.core.optimizers import DEFAULT as DEFAULT_OPTIMIZERS
from autotune.core.paths import default_storage
from autotune.core.precisions import FLAGS as PRECISION_FLAGS
from autotune.core.run_events import required
from autotune.core.space import derive_space
from autotune.core.spec import SearchSpec
from autotune.core.trial import TrialRecord
from autotune.doctor import Check, run_doctor
from autotune.hf.models import count_parameters, max_positions, resolve_model
from autotune.hf.peft import adapter_settings
from autotune.hf.training_args import (
    available_optimizers,
    cli_flags,
    merge,
    read_arguments_file,
    training_fields,
    tuned_arguments,
    validate,
)
from autotune.store.compat import study_id as stored_id
from autotune.store.storage import STORAGE_ENV, mask, serve_dashboard
from autotune.store.store import StudyStore
from autotune.system.devices import detect_device
from autotune.tuning.estimate import estimate_rows
from autotune.tuning.rehearsal import failure_error, job_failure
from autotune.tuning.selection import nothing_fits, select_export, select_for
from autotune.views.export import export_selected, parity_summary, run_changes
from autotune.views.report import write_report
from autotune.views.show import StudyView, trial_rows


def resolve_storage(storage: str | None, studies_dir: Path) -> str:
    """--storage, else $AUTOTUNE_STORAGE (kept out of `ps`), else the SQLite file."""

    return storage or os.environ.get(STORAGE_ENV) or default_storage(studies_dir)


def best_of_study(
    *, study_name: str, storage: str, objective: Objective | None
) -> tuple[TrialRecord, SearchSpec, list[TrialRecord]]:
    """The study's selected trial by `objective` (None: the one it was searched for)."""
    store = StudyStore.load(url=storage, name=study_name)
    recs = store.records()
    objective = objective or store.settings.objective()
    best = select_export(store.spec, recs, objective, rehearse=store.settings.rehearses())
    if best is None:
        raise none_exported(study_name, store.spec, recs, rehearse=store.settings.rehearses())
    return best, store.spec, recs


def none_exported(
    study_name: str, spec: SearchSpec, records: list[TrialRecord], *, rehearse: bool
) -> NoFitError:
    """Why a study has no config to export: a rehearsal failure no config changes, a
    config that fits and is not rehearsed yet, or none that fits."""
    if required(spec, rehearse) and (failed := job_failure(records)) is not None:
        return failure_error(failed)
    if select_for(spec, records) is not None:
        return nothing_fits(records, spec, rehearse=rehearse)
    return NoFitError(f"study {study_name!r} has no trial that ran ok within the budget")


def export_command(
    *,
    study_name: str,
    storage: str,
    output: Path,
    objective: Objective | None,
    force: bool = False,
) -> Path:
    """Write the study's best config as TrainingArguments JSON (+ sidecar), selected by
    `objective` (None: the one the study was searched for)."""

    store = StudyStore.load(url=storage, name=study_name)
    records, rehearse = store.records(), store.settings.rehearses()
    best = export_selected(
        records=records,
        spec=store.spec,
        study_name=study_name,
        output=output,
        objective=objective or store.settings.objective(),
        validate=False,
        force=force,
        parity=store.settings.parity(),
        rehearse=rehearse,
    )
    if best is None:
        raise none_exported(study_name, store.spec, records, rehearse=rehearse)
    return output


def hand_off(
    spec: SearchSpec, record: TrialRecord, target: DeviceKind | None
) -> tuple[dict[str, Any], list[str]]:
    """The tuned fields for a run on `target` (default: the device the study was tuned
    on), and notes on what is device-specific: `use_cpu` must not reach a GPU script
    unannounced, nor a CPU study's figures pass for a GPU's."""

    tuned_on = spec.device.kind
    target = target or tuned_on
    tuned = tuned_arguments(
        record.candidate,
        device_kind=target,
        checkpointing_field=spec.checkpointing_field,
        tf32_kept=spec.recipe.tf32,
    )
    if record.rehearsal is not None:  # the evaluation settings it found to fit
        tuned.update(record.rehearsal.exported_fields())
    notes = []
    if target != tuned_on:
        notes.append(
            f"tuned on {tuned_on} ({spec.device.name}): the speed and memory figures are "
            f"that device's, not {target}'s; tune on the {target} to know"
        )
    elif tuned.get("use_cpu"):
        notes.append(
            "tuned on the CPU, so use_cpu true is set: for a GPU run pass "
            "--for-device cuda (and tune on the GPU for its figures)"
        )

    notes.extend(f"in your script: {line}" for line in run_changes(record, spec))
    return tuned, notes


def merge_command(
    *,
    study_name: str,
    storage: str,
    objective: Objective | None,
    merge_into: Path,
    for_device: DeviceKind | None = None,
) -> tuple[dict[str, tuple[Any, Any]], list[str]]:
    """Replace only the tuned fields in the user's arguments file; returns what changed
    and the notes on device-specific fields."""

    best, spec, _ = best_of_study(study_name=study_name, storage=storage, objective=objective)
    args_class = spec.model.args_class  # the user's factory's class; "": TrainingArguments
    user = read_arguments_file(merge_into, option="--merge-into", args_class=args_class)
    tuned, notes = hand_off(spec, best, for_device)
    merged = merge(user, tuned)
    known = training_fields(args_class)
    # Precision flags are checked against this machine's hardware by TrainingArguments:
    # for another device than the one tuned on, check the rest.
    device_bound = {*PRECISION_FLAGS, "use_cpu"} if for_device else set()
    fields = {k: v for k, v in merged.items() if k in known and k not in device_bound}
    validate(fields, error=ExportError, where=f"--merge-into {merge_into}", args_class=args_class)
    try:
        write_atomic(merge_into, json.dumps(merged, indent=2) + "\n")
    except OSError as exc:
        raise ExportError(
            f"cannot write {merge_into}: {exc.strerror or exc}; free disk space or fix the "
            "permissions, then run it again (the file is as it was)"
        ) from None
    changed = {k: (user.get(k), v) for k, v in tuned.items() if user.get(k) != v}
    return changed, notes


def flags_command(
    *,
    study_name: str,
    storage: str,
    objective: Objective | None,
    for_device: DeviceKind | None = None,
) -> tuple[str, list[str]]:
    """The tuned fields as command-line flags for HfArgumentParser scripts, and notes."""

    best, spec, _ = best_of_study(study_name=study_name, storage=storage, objective=objective)
    tuned, notes = hand_off(spec, best, for_device)
    return cli_flags(tuned), notes


def show_command(*, study_name: str, storage: str, objective: Objective | None) -> Any:
    """The study's rows, best first by `objective` (None: the one the study was searched
    for); views.show prints them."""

    store = StudyStore.load(url=storage, name=study_name)
    records, state, rehearse = store.records(), store.settings.parity(), store.settings.rehearses()
    objective = objective or store.settings.objective()
    best = select_export(store.spec, records, objective, rehearse=rehearse)
    changed = None
    if best is not None:
        changed = parity_summary(best, store.spec, records, state, rehearse=rehearse)
    rows = trial_rows(records, store.spec, objective, rehearse=rehearse)
    return StudyView(study_name, store.spec, rows, changed, objective)


def report_command(
    *, study_name: str, storage: str, output_dir: Path, objective: Objective | None = None
) -> list[Path]:
    """The study's HTML page and charts, its best by `objective` (None: the one the
    study was searched for)."""

    store = StudyStore.load(url=storage, name=study_name)
    recs = store.records()
    objective = objective or store.settings.objective()
    rows = trial_rows(recs, store.spec, objective, rehearse=store.settings.rehearses())
    state = store.settings.parity()
    recipe = state.reference if state else None
    return write_report(
        records=recs,
        rows=rows,
        spec=store.spec,
        study_name=study_name,
        output_dir=output_dir,
        recipe=recipe,
        objective=objective,
    )


def dashboard_command(*, study_name: str, storage: str, host: str, port: int) -> None:
    """Serve optuna-dashboard on the study's storage until interrupted."""

    store = StudyStore.load(url=storage, name=study_name)
    study_id = stored_id(store.storage, store.study)
    for line in dashboard_lines(study_name, mask(storage), host, port, study_id):
        print(line, flush=True)
    serve_dashboard(storage, host=host, port=port)


def dashboard_lines(
    study_name: str, storage: str, host: str, port: int, study_id: int
) -> list[str]:
    """What `dashboard` says before it serves: where, how to reach it from another
    machine, what it serves and what a trial's two values are."""

    url = f"http://{host}:{port}/dashboard/studies/{study_id}"
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    reach = (
        f"it listens on {host} only: from another machine, forward the port with "
        f"`ssh -L {port}:localhost:{port} THIS_HOST` and open the same URL there"
        if loopback
        else f"it listens on {host}, without authentication"
    )
    return [
        f"optuna-dashboard for study {study_name!r} in {storage}: {url}",
        reach,
        "it serves every study in that storage; each trial holds two values: samples/s "
        "(higher is better) and peak memory in GiB (lower), with the budget as a constraint",
        "Ctrl-C stops it",
    ]


def estimate_command(
    *,
    model: str,
    task: str,
    device: str,
    seq_len: int | None,
    target_len: int,
    batch: int,
    precisions: tuple[str, ...] | None,
    optimizers: tuple[str, ...] | None,
    lora: str | None = None,
    peft_config: Path | None = None,
) -> Any:
    """The memory estimate per precision/optimizer/checkpointing; runs nothing. With
    `lora` or `peft_config`, of the model wrapped in that adapter (the frozen base held as
    loaded, gradients and optimizer state for the adapter alone)."""

    model_spec = resolve_model(model, task=task)
    if lora or peft_config:
        model_spec = dataclasses.replace(model_spec, adapter=adapter_settings(lora, peft_config))
    device_info = detect_device(device)
    seq = seq_len or min(512, max_positions(model_spec.config) or 512)
    counted = count_parameters(model_spec)
    levels, _ = checkpointing.offered(counted.checkpoint_layers, device_info.kind)
    space = derive_space(
        device_info,
        global_batch_size=batch,
        precisions=precisions,
        optimizers=optimizers,
        checkpointing=levels,
        installed_optimizers=available_optimizers(),
    )
    return estimate_rows(model_spec, device_info.kind, space, counted, batch, seq, target_len)


def doctor_command(*, device: str, on_check: Callable[[Check], None] = lambda check: None) -> Any:
    """Check each assumption the search rests on, on this machine (views.doctor prints),
    each check handed to `on_check` as it ends."""
    # for their versions: the commands that only read a study never load them
    import torch
    import transformers

    info = detect_device(device)
    installed = available_optimizers()
    wanted = DEFAULT_OPTIMIZERS
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "optuna": importlib.metadata.version("optuna"),
        "cuda": str(torch.version.cuda),
    }
    return run_doctor(
        device=info,
        optimizers=tuple(o for o in wanted if o in installed),
        versions=versions,
        on_check=on_check,
    )
