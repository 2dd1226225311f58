"""The library functions behind each command: keyword-only, no printing of results, no exits."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from autotune.errors import NoFitError, StudyError, UsageError
from autotune.estimate import check_budget, count_parameters
from autotune.export import export_selected
from autotune.hardware import detect_device
from autotune.models import max_positions, resolve_model
from autotune.search import SearchLimits, SearchReport, run_search
from autotune.space import derive_space
from autotune.spec import SearchSpec
from autotune.study import load_study, records


def build_spec(
    *,
    model: str,
    task: str,
    device: str,
    memory_budget: int | None,
    headroom: float,
    global_batch_size: int,
    seq_len: int | None,
    target_len: int,
    precisions: tuple[str, ...] | None,
    optimizers: tuple[str, ...] | None,
    checkpointing: tuple[str, ...] | None,
    warmup_steps: int,
    measure_steps: int,
    seed: int,
) -> SearchSpec:
    """Validate every option against the model and the device; raise UsageError if off."""
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
    space = derive_space(
        device_info,
        global_batch_size=global_batch_size,
        precisions=precisions,
        optimizers=optimizers,
        checkpointing=tuple(c == "on" for c in checkpointing) if checkpointing else None,
    )
    check_budget(count_parameters(model_spec), space.optimizers, budget)
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
    )


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
    **spec_options: object,
) -> SearchReport:
    from autotune.cli import default_storage, default_study_name
    from autotune.progress import Progress

    spec = build_spec(model=model, **spec_options)  # type: ignore[arg-type]
    name = study_name or default_study_name(model)
    storage = storage or default_storage(studies_dir)
    if storage.startswith("sqlite:///"):
        folder = Path(storage.removeprefix("sqlite:///")).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StudyError(
                f"cannot open storage {storage!r}: cannot create {folder} ({exc.strerror})"
            ) from None
    return run_search(
        spec=spec,
        study_name=name,
        storage=storage,
        studies_dir=studies_dir,
        limits=SearchLimits(max_trials, time_budget, trial_timeout),
        sampler=sampler,
        output=output or studies_dir / f"{name}.best.json",
        objective=objective,
        observer=Progress(Console(highlight=False, soft_wrap=True), live=not quiet),
    )


def export_command(*, study_name: str, storage: str, output: Path, objective: str) -> Path:
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
