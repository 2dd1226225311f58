"""The search command: options -> plan (SearchSpec) -> the study loop -> selection ->
export, and what it hands back (`SearchOutcome`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from autotune.commands import resolve_storage
from autotune.core.enums import Objective
from autotune.core.errors import StudyError, UsageError
from autotune.core.parity import CALIBRATED_STEPS
from autotune.core.paths import check_study_name, claim_folder, default_study_name, study_folder
from autotune.core.stats import speed_ratio
from autotune.core.units import format_duration
from autotune.search.deadline import Deadline
from autotune.search.limits import SearchLimits
from autotune.search.outcome import SearchOutcome
from autotune.store.store import StudyStore

# A search given no --time-budget stops within this: never hours unasked (20 probes of
# up to --trial-timeout's 10 minutes each would be over three)
DEFAULT_TIME_BUDGET_S = 30 * 60.0

# Parity run length by --parity mode, when --parity-steps is not given: 20 steps verify
# (core/parity.CALIBRATED_STEPS); a quick check's 4 catch NaNs and gross divergence
PARITY_STEPS = {"on": CALIBRATED_STEPS, "quick": 4}


def search_command(  # long: one keyword per `search` option, then a few calls
    *,
    studies_dir: Path,
    model: str,
    study_name: str | None,
    storage: str | None,
    output: Path | None,
    max_trials: int,
    time_budget: float | None,
    trial_timeout: float,
    sampler: str,
    objective: Objective,
    quiet: bool,
    confirm_top: int,
    confirm_steps: int | None,
    parity: str = "on",
    parity_steps: int | None = None,
    fork_server: bool,
    fixed_steps: bool = False,
    reuse: bool = True,
    parallel: int = 1,
    devices: tuple[str, ...] | None = None,
    nproc_per_node: int = 1,
    dataset: str | None = None,
    dataset_split: str = "train",
    text_column: str | None = None,
    target_column: str | None = None,
    tokenizer: str | None = None,
    force: bool = False,
    log_to_stderr: bool = False,
    **spec_options: Any,
) -> SearchOutcome:  # the search's options, one keyword each (cli.search passes them)
    """Search, record every trial in the study, export the best config to `output`."""
    from autotune.search.plan import (
        DataOptions,
        Layout,
        SpecOptions,
        build_spec,
        workload_defaults,
    )
    from autotune.search.run import prepare_store
    from autotune.search.workers import run_workers
    from autotune.views.export import previous_export

    name = check_study_name(study_name or default_study_name(model))
    url = resolve_storage(storage, studies_dir)
    folder = study_folder(studies_dir, name, url)
    output = output or studies_dir / f"{folder.name}.best.json"
    previous_export(output, force=force)  # refuse now, not after the search
    claim_folder(folder, name, url, write=False)  # before the data is tokenized into it
    if dataset is None and (text_column or target_column or tokenizer):
        raise UsageError("--text-column, --target-column and --tokenizer need --dataset")
    data = None
    if dataset is not None:
        data = DataOptions(
            dataset, dataset_split, text_column, target_column, tokenizer, folder / "data"
        )
    layout = Layout(nproc_per_node, parallel, devices)
    options = SpecOptions(model=model, **spec_options)
    spec, slots = build_spec(options, dataset=data, layout=layout)
    notes = workload_defaults(options, spec)
    if time_budget is None:
        time_budget = DEFAULT_TIME_BUDGET_S
        notes.append(f"time budget {format_duration(time_budget)}: a default; set --time-budget")
    _ensure_sqlite_folder(url)
    store = prepare_store(spec=spec, study_name=name, storage=url, sampler=sampler)
    claim_folder(folder, name, url)
    limits = SearchLimits(
        max_trials=max_trials,
        trial_timeout_s=trial_timeout,
        confirm_top=confirm_top,
        confirm_steps=confirm_steps or 2 * spec.measure_steps,
        parity_steps=0 if parity == "off" else parity_steps or PARITY_STEPS[parity],
        parity_quick=parity == "quick",
        objective=objective,
        fork_server=fork_server,
        adaptive=not fixed_steps,
        reuse=reuse,
        propose=sampler == "model",
    )
    deadline = Deadline.after(time_budget)
    if slots:
        run_workers(
            spec=spec,
            slots=slots,
            study_name=name,
            storage=url,
            study_dir=folder,
            sampler=sampler,
            limits=limits,
            deadline=deadline,
        )
    return _search_and_export(
        store=store,
        folder=folder,
        limits=limits,
        deadline=deadline,
        explore=not slots,
        live=not quiet and not slots,
        output=output,
        objective=objective,
        force=force,
        log_to_stderr=log_to_stderr,
        notes=notes,
    )


def _search_and_export(
    *,
    store: StudyStore,
    folder: Path,
    limits: SearchLimits,
    deadline: Deadline,
    explore: bool,
    live: bool,
    output: Path,
    objective: Objective,
    force: bool,
    log_to_stderr: bool = False,
    notes: list[str] | None = None,
) -> SearchOutcome:
    """The parent's part: explore (unless workers did), confirm, select, export."""
    from rich.console import Console

    from autotune.search.parity import reference_for
    from autotune.search.run import run_search
    from autotune.search.selection import nothing_fits, plain_default
    from autotune.views.export import export_selected, parity_summary
    from autotune.views.progress import Progress

    spec, name = store.spec, store.name
    console = Console(highlight=False, soft_wrap=True, stderr=log_to_stderr, markup=False)
    progress = Progress(console, live=live, deadline=deadline, notes=notes or [])
    try:
        report = run_search(
            store=store,
            study_dir=folder,
            limits=limits,
            deadline=deadline,
            observer=progress,
            explore=explore,
        )
        parity = store.parity() if limits.parity_steps else None
        records = list(report.records)
        if parity is None:  # --parity off: verdicts of earlier runs do not apply either
            records = [dataclasses.replace(r, parity=None) for r in records]
        best = export_selected(
            records=records,
            spec=spec,
            study_name=name,
            output=output,
            objective=objective,
            validate=True,
            force=force,
            parity=parity,
        )
        progress.on_search_end(report)
    finally:
        progress.close()
    if best is None:
        raise nothing_fits(records, spec)
    changed = parity_summary(best, reference_for(spec, records, parity), parity)
    default = plain_default(records, spec)
    ratio = speed_ratio(best.result, default.result) if default and default != best else None
    return SearchOutcome(
        name,
        best,
        output,
        report.probes_this_run,
        report.elapsed_s,
        report.stop_reason,
        changed,
        spec.train_steps,
        default,
        ratio,
    )


def _ensure_sqlite_folder(url: str) -> None:
    if not url.startswith("sqlite:///"):
        return
    folder = Path(url.removeprefix("sqlite:///")).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StudyError(
            f"cannot open storage {url!r}: cannot create {folder} ({exc.strerror})"
        ) from None
