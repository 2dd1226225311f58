"""From the user's options to a SearchSpec: every check first, then anything written.

The model is resolved, the device detected, the space derived and the budget checked;
only when all of that (and the worker layout) holds is the user's dataset tokenized.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.core import checkpointing
from autotune.core.dataset import DataSpec
from autotune.core.device import DeviceInfo, supported_precisions
from autotune.core.enums import DeviceKind, Precision, Task
from autotune.core.errors import UsageError
from autotune.core.job import JobFacts
from autotune.core.levers import ZERO_STAGE
from autotune.core.space import SearchSpace, derive_space
from autotune.core.spec import SearchSpec
from autotune.core.trial import LEVERS, ModelSpec
from autotune.hf.corpus import SAMPLINGS, prepare
from autotune.hf.levers import offer, parse_lever_options
from autotune.hf.models import ParameterCount, count_parameters, max_positions, resolve_model
from autotune.hf.peft import adapter_settings
from autotune.hf.sharding import build_cpu_op, shards
from autotune.hf.training_args import (
    BaseArguments,
    available_optimizers,
    base_arguments,
    checkpointing_field,
    read_arguments_file,
)
from autotune.system.devices import cuda_device_count, detect_device
from autotune.tuning._user_job import (
    FIXED_BY_JOB,
    fixed_by_job,
    held_in,
    job_checkpointing,
    job_counts,
    job_model,
    job_optimizers,
    job_profile,
    job_recipe,
    survey,
    trains_in,
    unmeasured,
)
from autotune.tuning.estimate import check_budget
from autotune.tuning.options import SearchOptions
from autotune.tuning.time_plan import measure_steps_for
from autotune.tuning.workers import Slot, plan_slots

DEFAULT_GLOBAL_BATCH = 32
DEFAULT_TARGET_LEN = 128
MAX_GLOBAL_BATCH = 1 << 20  # a million samples per optimizer step is past any real recipe


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
class Layout:
    """How the search uses the machine: DDP processes per probe, worker slots."""

    nproc_per_node: int = 1
    parallel: int = 1
    devices: tuple[str, ...] | None = None

    @classmethod
    def of(cls, options: SearchOptions) -> Layout:
        return cls(options.nproc_per_node, options.parallel, options.devices)


def build_spec(
    options: SearchOptions, *, layout: Layout = Layout(), dataset: DataOptions | None = None
) -> tuple[SearchSpec, list[Slot]]:
    """Validate every option against the model and the device; raise UsageError if off.

    With a dataset, it is tokenized once into `dataset.out_dir`, after every check; a
    sequence length not given is then the data's longest (--seq-len caps it)."""
    o = options
    device_info = detect_device(o.device)
    model_spec, job, base, batch = _workload(o, device_info.kind, dataset is not None, layout)
    seq_len, target_len = _lengths(o, base, model_spec.config, job)
    slots = _check_layout(layout, batch, device_info.kind)
    budget = _budget(o.memory_budget, device_info.total_memory_bytes, len(slots), device_info.kind)
    if layout.devices and device_info.kind == DeviceKind.CUDA:  # confirm in a worker's slot
        device_info = dataclasses.replace(device_info, index=int(layout.devices[0]))
    per_process = batch // layout.nproc_per_node
    recipe = job_recipe(job, base.recipe)
    counted = job_counts(job) if job else _count(model_spec)
    space = _space(o, base, recipe, model_spec, job, device_info, per_process, layout, dataset)
    space = _graded(space, o.checkpointing, counted.checkpoint_layers, device_info.kind, job)
    _check_budget(counted, space, budget, layout.nproc_per_node, device_info.kind)
    data = None
    if dataset is not None:  # the first write: every check above has passed
        data, seq_len, target_len = _tokenize(dataset, o, base, model_spec, space, target_len)
    spec = SearchSpec(
        model=model_spec,
        device=device_info,
        space=space,
        seq_len=seq_len,
        target_len=target_len,
        memory_budget_bytes=budget,
        headroom=o.headroom,
        warmup_steps=o.warmup_steps,
        measure_steps=o.measure_steps or measure_steps_for(o.budget_s),
        seed=o.seed,
        base_arguments=base.carried,
        kept_arguments=base.kept,
        unmeasured_lengths=unmeasured(job),
        recipe_settings=recipe,
        parameters=counted.total,
        embedding_parameters=counted.embedding,
        largest_parameter=counted.largest,
        trainable_parameters=counted.trainable,
        frozen_bytes=counted.frozen_bytes,
        job_profile=job_profile(job),
        nproc_per_node=layout.nproc_per_node,
        data=data,
        checkpointing_field=checkpointing_field(),
        train_steps=_train_steps(o.train_steps, base),
    )
    return spec, slots


def _graded(
    space: SearchSpace,
    asked: Sequence[str] | None,
    layers: int | None,
    kind: DeviceKind,
    job: JobFacts | None,
) -> SearchSpace:
    """The space with the checkpointing levels the model and device offer (and why not
    the others), narrowed to those asked for; a job that turns checkpointing on itself
    runs every level but off (the Trainer re-grades it, never turns it off)."""
    levels, why = checkpointing.offered(layers, kind)
    forced = job is not None and job.forced_checkpointing
    if forced:  # off asked with others is dropped: the space's list says why
        levels = tuple(level for level in levels if level)
    if asked:
        try:
            wanted = checkpointing.parse(asked)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        wanted = tuple(level for level in wanted if level or not forced)
        missing = [w for w in wanted if w not in levels]
        if missing:
            said = dict(why).get(f"checkpointing {missing[0]}", "not offered here")
            raise UsageError(f"--checkpointing {missing[0]}: {said}; offered: {', '.join(levels)}")
        levels = wanted
    return dataclasses.replace(space, checkpointing=levels, not_offered=(*space.not_offered, *why))


def _check_budget(
    counted: ParameterCount, space: SearchSpace, budget: int, nproc: int, kind: DeviceKind
) -> None:
    """Refuse a budget the job as built cannot fit (each parameter as it is held); build
    DeepSpeed's CPU optimizer once, before any probe, when ZeRO is searched here."""
    zero = max(dict(space.levers).get(ZERO_STAGE.name, (0,)))
    check_budget(
        counted.total,
        space.precisions,
        space.optimizers,
        budget,
        split=shards(zero, nproc),
        embedding=counted.embedding,
        trainable=counted.trainable,
        frozen_bytes=counted.frozen_bytes,
    )
    if zero and kind == DeviceKind.CPU:
        build_cpu_op()  # once per machine; no probe pays it


def _workload(
    o: SearchOptions, kind: DeviceKind, with_dataset: bool, layout: Layout
) -> tuple[ModelSpec, JobFacts | None, BaseArguments, int]:
    """What is trained (the user's job, surveyed, or a stand-in from --model, maybe with a
    LoRA adapter), their arguments, and the global batch kept exactly: --global-batch-size,
    else their arguments' per-device batch x accumulation x the processes that run it."""
    job = survey(o, kind, with_dataset) if o.trainer else None
    nproc = layout.nproc_per_node
    base = _base(o.base_args, o.global_batch_size, job.args_class if job else "", nproc)
    per_process = base.process_batch_size or (
        job.per_device_train_batch_size * job.gradient_accumulation_steps if job else 0
    )
    batch = _global_batch(o.global_batch_size or per_process * nproc or DEFAULT_GLOBAL_BATCH)
    model = job_model(o, job) if job else resolve_model(o.model or "", task=o.task)
    if o.lora or o.peft_config:
        model = dataclasses.replace(model, adapter=adapter_settings(o.lora, o.peft_config))
    return model, job, base, batch


def _space(
    o: SearchOptions,
    base: BaseArguments,
    recipe: dict[str, Any],
    model: ModelSpec,
    job: JobFacts | None,
    device: DeviceInfo,
    per_process_batch: int,
    layout: Layout,
    dataset: DataOptions | None,
) -> SearchSpace:
    """The space this device, the model, the user's job and the installed packages allow,
    narrowed by the options: the classic dimensions and the levers offered (and why the
    others not)."""
    levers, not_offered = offer(
        model,
        device.kind,
        dataset=dataset is not None,
        fixed={k: v for k, v in recipe.items() if k in LEVERS},
        asked=parse_lever_options(o.levers),
        nproc_per_node=layout.nproc_per_node,
        own_deepspeed=bool(base.carried.get("deepspeed")),
    )
    fixed_why = job_checkpointing(o.checkpointing, job)
    installed = available_optimizers()
    offers_fp16 = Precision.FP16 in supported_precisions(device)
    optimizers = job_optimizers(o.optimizers, installed, recipe, job) if job else o.optimizers
    return derive_space(
        device,
        global_batch_size=per_process_batch,
        precisions=o.precisions,
        optimizers=optimizers,
        samplings=SAMPLINGS if dataset else (str(recipe.get("train_sampling_strategy", "random")),),
        installed_optimizers=installed,
        levers=levers,
        not_offered=(*not_offered, *fixed_by_job(job, fixed_why, offers_fp16)),
        held_in=held_in(job),
        trains_in=trains_in(job),
    )


def job_notes(spec: SearchSpec) -> list[str]:
    """What the user's job fixes of the classic dimensions, and why (their factory turns
    checkpointing on; their weights are not held in 32 bits)."""
    return [f"{name}: {why}" for name, why in spec.space.not_offered if name in FIXED_BY_JOB]


def workload_defaults(options: SearchOptions, spec: SearchSpec) -> list[str]:
    """The workload figures this search took from a default rather than from you, each
    with how to set it: a config that fits 512 tokens says little of a 4k-token run."""
    o = options
    base = _base(o.base_args, o.global_batch_size, spec.model.args_class, spec.nproc_per_node)
    notes = []
    if spec.unmeasured_lengths:
        notes.append(spec.unmeasured_lengths)
    if not (o.global_batch_size or base.process_batch_size):
        notes.append(
            f"global batch {spec.global_batch_size}: a default; set --global-batch-size, or "
            "per_device_train_batch_size and gradient_accumulation_steps in --base-args"
        )
    if spec.data is None and not (o.seq_len or base.seq_len or spec.model.trainer):
        notes.append(
            f"sequence length {spec.seq_len}: a default (the model's limit, at most 512); "
            "set --seq-len to your longest input, or pass --dataset"
        )
    if (
        spec.model.task == Task.SEQ2SEQ
        and spec.data is None
        and not (o.target_len or base.target_len)
    ):
        notes.append(f"target length {spec.target_len}: a default; set --target-len")
    return notes


def _train_steps(asked: int | None, base: BaseArguments) -> int:
    """The user's run length: --train-steps, else max_steps in --base-args, else 0."""
    if asked is not None and asked < 1:
        raise UsageError(f"--train-steps {asked}: give the optimizer steps of your run (>= 1)")
    return asked or base.train_steps or 0


def _global_batch(batch: int) -> int:
    if batch > MAX_GLOBAL_BATCH:
        raise UsageError(
            f"--global-batch-size {batch} is over the limit of {MAX_GLOBAL_BATCH}; "
            "give the samples per optimizer step"
        )
    return batch


def _lengths(
    o: SearchOptions, base: BaseArguments, config: dict[str, Any], job: JobFacts | None = None
) -> tuple[int, int]:
    """The worst-case lengths probes use: for the user's job whose data gives its lengths,
    what its probes train on (its longest sample, cut at their max_length); else asked,
    from --base-args, their max_length, or the model's limit."""
    limit = max_positions(config)
    if job is not None and job.longest is not None:
        trained = min(job.longest, job.max_length or job.longest)
        return trained, o.target_len or base.target_len or DEFAULT_TARGET_LEN
    seq_len = o.seq_len or base.seq_len or (job.max_length if job else None)
    if seq_len is None:
        seq_len = min(512, limit or 512)
    elif limit is not None and seq_len > limit:
        raise UsageError(
            f"--seq-len {seq_len} exceeds {o.model or o.trainer}'s limit of {limit} positions"
        )
    return seq_len, o.target_len or base.target_len or DEFAULT_TARGET_LEN


def _budget(asked: int | None, total: int, workers: int, kind: DeviceKind) -> int:
    """The budget in bytes: what was asked (never more than the device has), else all.

    With --parallel N on the CPU, N probes run at once on one machine's memory: the
    default budget is split between them, and a budget N probes cannot have together is
    refused (the kernel would SIGKILL one, recorded as an OOM that skips larger batches)."""
    share = total // workers if kind == DeviceKind.CPU and workers > 1 else total
    if asked is None:
        return share
    if asked > total:
        raise UsageError(
            f"--memory-budget {asked / 2**30:.1f} GiB exceeds this device's {total / 2**30:.1f} GiB"
        )
    if asked > share:
        raise UsageError(
            f"--memory-budget {asked / 2**30:.1f} GiB for each of --parallel {workers} probes "
            f"at once exceeds this machine's {total / 2**30:.1f} GiB; give at most "
            f"{share / 2**30:.1f} GiB, or fewer --parallel workers"
        )
    return asked


def _tokenize(
    dataset: DataOptions,
    o: SearchOptions,
    base: BaseArguments,
    model: ModelSpec,
    space: SearchSpace,
    target_len: int,
) -> tuple[DataSpec, int, int]:
    """Tokenize the user's data once; its lengths set those the user did not give."""
    data, seq_len, data_target_len = prepare(
        source=dataset.source,
        split=dataset.split,
        task=model.task,
        text_column=dataset.text_column,
        target_column=dataset.target_column,
        tokenizer=dataset.tokenizer,
        model_name=o.model,
        vocab_size=model.vocab_size,
        seq_len=o.seq_len or base.seq_len,
        target_len=o.target_len or base.target_len,
        max_positions=max_positions(model.config),
        micro_batches=space.all_batches,
        global_batch=space.global_batch_size,
        out_dir=dataset.out_dir,
    )
    return data, seq_len, data_target_len or target_len


def _check_layout(layout: Layout, global_batch_size: int, kind: DeviceKind) -> list[Slot]:
    """DDP needs a batch the processes share evenly, and the GPUs; workers need slots."""
    n = layout.nproc_per_node
    if n > 1 and (layout.parallel > 1 or layout.devices):
        raise UsageError(
            "--nproc-per-node runs each probe on several devices already; "
            "drop --parallel/--devices, or run several searches on one --storage"
        )
    if n > 1 and global_batch_size % n:
        raise UsageError(
            f"--global-batch-size {global_batch_size} is not divisible by --nproc-per-node "
            f"{n}; each process takes an equal share of the batch"
        )
    gpus = cuda_device_count() if kind == DeviceKind.CUDA else 0
    if n > 1 and kind == DeviceKind.CUDA and gpus < n:
        raise UsageError(f"--nproc-per-node {n} needs {n} GPUs; {gpus} visible")
    if layout.parallel > 1 or layout.devices:
        return plan_slots(kind, layout.parallel, layout.devices, gpus)
    return []


def _base(
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


def _count(model: ModelSpec) -> ParameterCount:
    """The stand-in's parameters (its --lora adapter's trainable ones among them)."""
    try:
        return count_parameters(model)
    except ValueError as exc:  # peft: a target module the model does not have
        if not model.adapter:
            raise
        first = str(exc).strip().splitlines()[0]
        raise UsageError(f"--lora: {first}; name layers {model.name} has") from None
