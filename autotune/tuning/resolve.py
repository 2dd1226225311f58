"""The job resolved once, before anything is planned: every fact the plan reads from
outside `tuning` (`resolve` -> `Facts`), and the two things a plan writes once every
check has passed (`tokenize`, `build_zero_op`).

The device is detected, the user's job surveyed (their factory built once in a child)
or the --model stand-in resolved, their arguments file read in their class, the model's
parameters counted as they are held, and what the device, the installed packages and
the model offer of the levers and optimizers read. `tuning/plan.py` plans from these
facts alone: this is the one module of the plan that calls into `hf`, `system` and
`launch`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from autotune.core.dataset import DataSpec
from autotune.core.device import DeviceInfo
from autotune.core.enums import DeviceKind
from autotune.core.errors import UsageError
from autotune.core.job import BaseArguments, JobFacts, ParameterCount, SurveyServer
from autotune.core.levers import ZERO_STAGE
from autotune.core.optimizers import PLAIN as PLAIN_OPTIMIZER
from autotune.core.precisions import MIXED_FLAGS
from autotune.core.space import SearchSpace
from autotune.core.trial import LEVERS, ModelSpec
from autotune.hf.corpus import prepare
from autotune.hf.levers import offer, parse_lever_options
from autotune.hf.models import count_parameters, max_positions, resolve_model
from autotune.hf.peft import adapter_settings
from autotune.hf.sharding import build_cpu_op
from autotune.hf.training_args import (
    TUNED,
    available_optimizers,
    base_arguments,
    checkpointing_field,
    class_default,
    read_arguments_file,
    read_json_object,
)
from autotune.launch.survey import survey_job
from autotune.system.devices import cuda_device_count, detect_device
from autotune.tuning._user_job import job_counts, job_model, job_recipe
from autotune.tuning.options import SearchOptions


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """--dataset and its companions; out_dir is where the tokenized data is kept."""

    source: str
    split: str
    text_column: str | None
    target_column: str | None
    tokenizer: str | None
    out_dir: Path


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the plan knows of the job, the machine and the installed packages."""

    device: DeviceInfo
    model: ModelSpec  # what is trained: the user's factory's model, or the stand-in
    job: JobFacts | None  # what their factory built (None: a --model stand-in)
    base: BaseArguments  # what their arguments file fixes
    counted: ParameterCount  # each parameter as it is held
    max_positions: int | None  # the model's limit on a sequence's length
    installed_optimizers: tuple[str, ...]
    # The levers offered here with their values, and why each other is not
    levers: tuple[tuple[str, tuple[Any, ...]], ...]
    levers_not_offered: tuple[tuple[str, str], ...]
    checkpointing_field: str  # what the installed transformers calls it
    gpus: int  # CUDA devices this process sees (0 on the CPU)
    # Their arguments class's optimizer where their file is silent (a factory's recipe
    # holds its class's own)
    default_optim: str = PLAIN_OPTIMIZER

    @property
    def recipe(self) -> dict[str, Any]:
        """The user's own values of the tuned fields: their file's over their class's."""
        recipe = job_recipe(self.job, self.base.recipe)
        if recipe and "optim" not in recipe:  # what their run trains: the class's default
            recipe = {**recipe, "optim": self.default_optim}
        return recipe


def resolve(
    o: SearchOptions,
    *,
    nproc_per_node: int,
    with_dataset: bool,
    server: SurveyServer | None = None,
) -> Facts:
    """Every fact the plan needs, each read once; UsageError for what cannot be read.
    `server`: the search's fork server, started ahead, which the survey is forked from."""
    device = detect_device(o.device)
    job = survey(o, device.kind, with_dataset, server) if o.trainer else None
    base = read_base(
        o.base_args, o.global_batch_size, job.args_class if job else "", nproc_per_node
    )
    model = job_model(o, job) if job else resolve_model(o.model or "", task=o.task)
    if o.lora or o.peft_config:
        model = dataclasses.replace(model, adapter=adapter_settings(o.lora, o.peft_config))
    recipe = job_recipe(job, base.recipe)
    levers, not_offered = offer(
        model,
        device.kind,
        dataset=with_dataset,
        fixed={k: v for k, v in recipe.items() if k in LEVERS},
        asked=parse_lever_options(o.levers),
        nproc_per_node=nproc_per_node,
        own_deepspeed=bool(base.carried.get("deepspeed")),
        own_fsdp=bool(base.carried.get("fsdp")),
        job=job,
    )
    return Facts(
        device=device,
        model=model,
        job=job,
        base=base,
        counted=job_counts(job) if job else count_parameters(model),
        max_positions=max_positions(model.config),
        installed_optimizers=available_optimizers(),
        levers=tuple(levers),
        levers_not_offered=tuple(not_offered),
        checkpointing_field=checkpointing_field(),
        gpus=cuda_device_count() if device.kind == DeviceKind.CUDA else 0,
        default_optim=default_optim(job.args_class if job else ""),
    )


def default_optim(args_class: str) -> str:
    """The optimizer the arguments class trains where the user's file is silent."""
    default = class_default("optim", args_class)
    return str(getattr(default, "value", default) or PLAIN_OPTIMIZER)


def survey(
    o: SearchOptions,
    device_kind: DeviceKind,
    with_dataset: bool,
    server: SurveyServer | None = None,
) -> JobFacts:
    """Build the user's job once, in a child, with their --base-args (in fp32: their
    precision may not run here), and read what their factory built."""
    if with_dataset:
        raise UsageError(
            "--dataset feeds the --model stand-in; with --trainer your factory's train "
            "dataset is the data: drop --dataset"
        )
    if o.lora or o.peft_config:
        raise UsageError(
            "--lora and --peft-config wrap the --model stand-in; with --trainer your "
            "factory builds the adapters: drop them"
        )
    raw = read_json_object(o.base_args, option="--base-args") if o.base_args else {}
    fields = {k: v for k, v in raw.items() if k not in TUNED} | dict.fromkeys(MIXED_FLAGS, False)
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        if key in raw:
            fields[key] = raw[key]
    return survey_job(
        trainer=o.trainer or "",
        args_class=o.args_class,
        fields=fields,
        recipe=raw,
        seed=o.seed,
        timeout_s=o.trial_timeout,
        use_cpu=device_kind == DeviceKind.CPU,
        server=server,
    )


def read_base(
    path: Path | None, global_batch_size: int | None, args_class: str = "", nproc: int = 1
) -> BaseArguments:
    """What --base-args fixes: the global batch (their per-device batch x accumulation x
    the `nproc` processes, as the Trainer and torchrun count it), sequence lengths, the
    other fields (read with the user's arguments class, `args_class`, when their factory
    takes one)."""
    if path is None:
        return BaseArguments(None, None, None, {})
    where = f"--base-args {path}"
    raw = read_arguments_file(path, option="--base-args", args_class=args_class)
    base = base_arguments(raw, where=where, args_class=args_class)
    theirs = base.process_batch_size and base.process_batch_size * nproc
    if global_batch_size is not None and theirs not in (None, global_batch_size):
        processes = f" x {nproc} processes" if nproc > 1 else ""
        raise UsageError(
            f"--global-batch-size {global_batch_size} contradicts {where} "
            f"(per_device_train_batch_size x gradient_accumulation_steps{processes} = "
            f"{theirs}); drop one of them"
        )
    return base


def tokenize(
    dataset: DataOptions, o: SearchOptions, facts: Facts, space: SearchSpace, target_len: int
) -> tuple[DataSpec, int, int]:
    """Tokenize the user's data once (the plan's first write); its lengths set those the
    user did not give."""
    model = o.model
    assert model is not None, "a --dataset feeds only the --model stand-in (survey refuses it)"
    data, seq_len, data_target_len = prepare(
        source=dataset.source,
        split=dataset.split,
        task=facts.model.task,
        text_column=dataset.text_column,
        target_column=dataset.target_column,
        tokenizer=dataset.tokenizer,
        model_name=model,
        vocab_size=facts.model.vocab_size,
        seq_len=o.seq_len or facts.base.seq_len,
        target_len=o.target_len or facts.base.target_len,
        max_positions=facts.max_positions,
        micro_batches=space.all_batches,
        global_batch=space.global_batch_size,
        out_dir=dataset.out_dir,
    )
    return data, seq_len, data_target_len or target_len


def build_zero_op(space: SearchSpace, kind: DeviceKind) -> None:
    """DeepSpeed's CPU op, built once per machine before any probe, when ZeRO is
    searched on the CPU (no probe pays the build)."""
    if kind == DeviceKind.CPU and any(dict(space.levers).get(ZERO_STAGE.name, (0,))):
        build_cpu_op()
