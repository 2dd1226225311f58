"""The library functions behind each command: keyword-only, no printing of results, no exits."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from autotune.hf.training_args import (
    BaseArguments,
    base_arguments,
    cli_flags,
    merge,
    read_arguments_file,
    training_fields,
)
from autotune.hf.corpus import SAMPLINGS, prepare
from autotune.core.errors import ExportError, NoFitError, StudyError, UsageError
from autotune.search.estimate import PROCESS_BYTES, breakdown, check_budget, count_parameters
from autotune.views.export import export_selected, verify
from autotune.probe.device import detect_device
from autotune.hf.models import max_positions, resolve_model
from autotune.core.paths import default_storage, default_study_name
from autotune.views.report import write_report
from autotune.views.show import print_table, rows_json, trial_rows
from autotune.search.run import SearchLimits, SearchReport, run_search
from autotune.search.selection import select_best
from autotune.core.space import derive_space
from autotune.core.spec import SearchSpec
from autotune.store.study import TrialRecord, load_study, records
from autotune.core.trial import write_atomic
from autotune.core.units import format_size

DEFAULT_GLOBAL_BATCH = 32
DEFAULT_TARGET_LEN = 128


def build_spec(
    *,
    model: str,
    task: str,
    device: str,
    memory_budget: int | None,
    headroom: float,
    global_batch_size: int | None,
    seq_len: int | None,
    target_len: int | None,
    base_args: Path | None,
    precisions: tuple[str, ...] | None,
    optimizers: tuple[str, ...] | None,
    checkpointing: tuple[str, ...] | None,
    warmup_steps: int,
    measure_steps: int,
    seed: int,
    nproc_per_node: int = 1,
    dataset: DataOptions | None = None,
) -> SearchSpec:
    """Validate every option against the model and the device; raise UsageError if off.

    With a dataset, it is tokenized once into `dataset.out_dir`; a sequence length not
    given is then the data's longest (--seq-len caps it, and the cut is stated)."""
    base = _base(base_args, global_batch_size)
    global_batch_size = global_batch_size or base.global_batch_size or DEFAULT_GLOBAL_BATCH
    seq_len = seq_len or base.seq_len
    asked_seq_len, asked_target_len = seq_len, target_len or base.target_len
    target_len = target_len or base.target_len or DEFAULT_TARGET_LEN
    model_spec = resolve_model(model, task=task)
    device_info = detect_device(device)
    limit = max_positions(model_spec.config)
    if seq_len is None:
        seq_len = min(512, limit or 512)
    elif limit is not None and seq_len > limit:
        raise UsageError(f"--seq-len {seq_len} exceeds {model}'s limit of {limit} positions")
    if memory_budget is not None and memory_budget > device_info.total_memory_bytes:
        raise UsageError(
            f"--memory-budget {memory_budget / 2**30:.1f} GiB exceeds this device's "
            f"{device_info.total_memory_bytes / 2**30:.1f} GiB"
        )
    budget = memory_budget or device_info.total_memory_bytes
    _check_processes(nproc_per_node, global_batch_size, device_info.kind)
    space = derive_space(
        device_info,
        global_batch_size=global_batch_size // nproc_per_node,
        precisions=precisions,
        optimizers=optimizers,
        checkpointing=tuple(c == "on" for c in checkpointing) if checkpointing else None,
        samplings=SAMPLINGS if dataset else ("random",),
    )
    parameters = count_parameters(model_spec)
    check_budget(parameters, space.precisions, space.optimizers, budget)
    data = None
    if dataset is not None:
        data, seq_len, data_target_len = prepare(
            source=dataset.source,
            split=dataset.split,
            task=model_spec.task,
            text_column=dataset.text_column,
            target_column=dataset.target_column,
            tokenizer=dataset.tokenizer,
            model_name=model,
            vocab_size=model_spec.vocab_size,
            seq_len=asked_seq_len,
            target_len=asked_target_len,
            max_positions=limit,
            micro_batches=space.all_batches,
            global_batch=space.global_batch_size,
            out_dir=dataset.out_dir,
        )
        target_len = data_target_len or target_len
    return SearchSpec(
        model=model_spec,
        device=device_info,
        space=space,
        seq_len=seq_len,
        target_len=target_len,
        memory_budget_bytes=budget,
        headroom=headroom,
        warmup_steps=warmup_steps,
        measure_steps=measure_steps,
        seed=seed,
        base_arguments=base.carried,
        parameters=parameters,
        nproc_per_node=nproc_per_node,
        data=data,
    )


def _check_processes(nproc_per_node: int, global_batch_size: int, device_kind: str) -> None:
    """A DDP probe needs a global batch the processes share evenly, and the GPUs."""
    if nproc_per_node == 1:
        return
    if global_batch_size % nproc_per_node:
        raise UsageError(
            f"--global-batch-size {global_batch_size} is not divisible by --nproc-per-node "
            f"{nproc_per_node}; each process takes an equal share of the batch"
        )
    if device_kind == "cuda":
        import torch

        if torch.cuda.device_count() < nproc_per_node:
            raise UsageError(
                f"--nproc-per-node {nproc_per_node} needs {nproc_per_node} GPUs; "
                f"{torch.cuda.device_count()} visible"
            )


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """--dataset and its companions; out_dir is where the tokenized data is kept."""

    source: str
    split: str
    text_column: str | None
    target_column: str | None
    tokenizer: str | None
    out_dir: Path


def _base(path: Path | None, global_batch_size: int | None) -> BaseArguments:
    """What --base-args fixes: the global batch, sequence lengths, the other fields."""
    if path is None:
        return BaseArguments(None, None, None, {})
    base = base_arguments(read_arguments_file(path, option="--base-args"))
    if global_batch_size is not None and base.global_batch_size not in (None, global_batch_size):
        raise UsageError(
            f"--global-batch-size {global_batch_size} contradicts --base-args {path} "
            f"(per_device_train_batch_size x gradient_accumulation_steps = "
            f"{base.global_batch_size}); drop one of them"
        )
    return base


def search_command(
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
    objective: str,
    quiet: bool,
    confirm_top: int,
    confirm_steps: int | None,
    fork_server: bool,
    parallel: int = 1,
    devices: tuple[str, ...] | None = None,
    dataset: str | None = None,
    dataset_split: str = "train",
    text_column: str | None = None,
    target_column: str | None = None,
    tokenizer: str | None = None,
    **spec_options: object,
) -> SearchReport:
    from autotune.views.progress import Progress
    from autotune.search.workers import plan_slots, run_workers

    name = study_name or default_study_name(model)
    data = None
    if dataset is not None:
        data = DataOptions(dataset, dataset_split, text_column, target_column, tokenizer,
                           studies_dir / name / "data")  # fmt: skip
    elif text_column or target_column or tokenizer:
        raise UsageError("--text-column, --target-column and --tokenizer need --dataset")
    spec = build_spec(model=model, dataset=data, **spec_options)  # type: ignore[arg-type]
    if spec.nproc_per_node > 1 and (parallel > 1 or devices):
        raise UsageError(
            "--nproc-per-node runs each probe on several devices already; "
            "drop --parallel/--devices, or run several searches on one --storage"
        )
    slots = plan_slots(spec.device.kind, parallel, devices) if parallel > 1 or devices else []
    storage = storage or default_storage(studies_dir)
    if storage.startswith("sqlite:///"):
        folder = Path(storage.removeprefix("sqlite:///")).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StudyError(
                f"cannot open storage {storage!r}: cannot create {folder} ({exc.strerror})"
            ) from None
    limits = SearchLimits(
        max_trials=max_trials,
        time_budget_s=time_budget,
        trial_timeout_s=trial_timeout,
        confirm_top=confirm_top,
        confirm_steps=confirm_steps or 2 * spec.measure_steps,
        fork_server=fork_server,
    )
    if slots:
        started = time.monotonic()
        run_workers(
            spec=spec,
            slots=slots,
            study_name=name,
            storage=storage,
            studies_dir=studies_dir,
            sampler=sampler,
            limits=limits,
        )
        left = None if time_budget is None else max(0.0, time_budget - (time.monotonic() - started))
        limits = dataclasses.replace(limits, explore=False, time_budget_s=left)
    progress = Progress(Console(highlight=False, soft_wrap=True), live=not quiet and not slots)
    try:
        return run_search(
            spec=spec,
            study_name=name,
            storage=storage,
            studies_dir=studies_dir,
            limits=limits,
            sampler=sampler,
            output=output or studies_dir / f"{name}.best.json",
            objective=objective,
            observer=progress,
        )
    finally:
        progress.close()


def best_of_study(
    *, study_name: str, storage: str, objective: str
) -> tuple[TrialRecord, SearchSpec, list[TrialRecord]]:
    study, spec = load_study(storage=storage, name=study_name)
    recs = records(study, spec)
    best = select_best(recs, fit_limit_bytes=spec.fit_limit_bytes, objective=objective)
    if best is None:
        raise NoFitError(f"study {study_name!r} has no trial that ran ok within the budget")
    return best, spec, recs


def export_command(*, study_name: str, storage: str, output: Path, objective: str) -> Path:
    """Write the study's best config as TrainingArguments JSON (+ sidecar)."""
    study, spec = load_study(storage=storage, name=study_name)
    best = export_selected(
        records=records(study, spec),
        spec=spec,
        study_name=study_name,
        output=output,
        objective=objective,
    )
    if best is None:
        raise NoFitError(f"study {study_name!r} has no trial that ran ok within the budget")
    return output


def merge_command(
    *, study_name: str, storage: str, objective: str, merge_into: Path
) -> dict[str, tuple[Any, Any]]:
    """Replace only the tuned fields in the user's arguments file; returns what changed."""
    best, spec, _ = best_of_study(study_name=study_name, storage=storage, objective=objective)
    user = read_arguments_file(merge_into, option="--merge-into")
    tuned = best.candidate.training_arguments(device_kind=spec.device.kind)
    merged = merge(user, tuned)
    verify({k: v for k, v in merged.items() if k in training_fields()})
    try:
        write_atomic(merge_into, json.dumps(merged, indent=2) + "\n")
    except OSError as exc:
        raise ExportError(f"cannot write {merge_into}: {exc.strerror or exc}") from None
    return {k: (user.get(k), v) for k, v in tuned.items() if user.get(k) != v}


def flags_command(*, study_name: str, storage: str, objective: str) -> str:
    """The tuned fields as command-line flags for HfArgumentParser scripts."""
    best, spec, _ = best_of_study(study_name=study_name, storage=storage, objective=objective)
    return cli_flags(best.candidate.training_arguments(device_kind=spec.device.kind))


def show_command(*, study_name: str, storage: str, fmt: str, objective: str) -> None:
    study, spec = load_study(storage=storage, name=study_name)
    rows = trial_rows(records(study, spec), spec, objective)
    if fmt == "json":
        print(rows_json(rows, spec, study_name))
    else:
        print_table(rows, spec, study_name)


def report_command(*, study_name: str, storage: str, output_dir: Path) -> list[Path]:
    study, spec = load_study(storage=storage, name=study_name)
    recs = records(study, spec)
    return write_report(
        records=recs,
        rows=trial_rows(recs, spec, "throughput"),
        spec=spec,
        study_name=study_name,
        output_dir=output_dir,
    )


def dashboard_command(*, study_name: str, storage: str, host: str, port: int) -> None:
    """Serve optuna-dashboard on the study's storage until interrupted."""
    from optuna_dashboard import run_server

    study, _ = load_study(storage=storage, name=study_name)
    print(
        f"optuna-dashboard for study {study_name!r}: "
        f"http://{host}:{port}/dashboard/studies/{study._study_id}",
        flush=True,
    )
    run_server(storage, host=host, port=port)


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
) -> None:
    """Print the memory estimate table; runs nothing."""
    from rich.table import Table

    model_spec = resolve_model(model, task=task)
    device_info = detect_device(device)
    seq = seq_len or min(512, max_positions(model_spec.config) or 512)
    space = derive_space(
        device_info, global_batch_size=batch, precisions=precisions, optimizers=optimizers
    )
    parameters = count_parameters(model_spec)
    table = Table(
        title=f"{model} ({model_spec.task}, {parameters / 1e6:.1f}M parameters): per-device "
        f"batch {batch}, {seq} tokens"
        + (f" / {target_len} target" if model_spec.task == "seq2seq" else "")
        + f"; + about {format_size(PROCESS_BYTES[device_info.kind])} for the process",
        title_justify="left",
    )
    for column in (
        "precision",
        "optim",
        "checkpointing",
        "bytes/param",
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "total",
    ):
        table.add_column(column, justify="left" if column in ("precision", "optim") else "right")
    for precision in space.precisions:
        for optim in space.optimizers:
            for ckpt in (False, True):
                candidate = space.candidate(batch, precision, ckpt, optim)
                b = breakdown(
                    parameters, model_spec.config, model_spec.task, candidate, seq, target_len
                )
                table.add_row(
                    precision,
                    optim,
                    "on" if ckpt else "off",
                    f"{b.static / parameters:.0f}",
                    format_size(b.weights),
                    format_size(b.gradients),
                    format_size(b.optimizer_state),
                    format_size(b.activations),
                    format_size(b.total),
                )
    Console(width=160).print(table)
