"""From the user's options to a SearchSpec: every check first, then anything written.

The model is resolved, the device detected, the space derived and the budget checked;
only when all of that (and the worker layout) holds is the user's dataset tokenized.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from autotune.core.dataset import DataSpec
from autotune.core.device import DeviceInfo
from autotune.core.enums import DeviceKind, Task
from autotune.core.errors import UsageError
from autotune.core.job import JobFacts
from autotune.core.space import SearchSpace, derive_space
from autotune.core.spec import SearchSpec
from autotune.core.trial import LEVERS, ModelSpec
from autotune.hf.corpus import SAMPLINGS, prepare
from autotune.hf.levers import offer, parse_lever_options
from autotune.hf.models import ParameterCount, count_parameters, max_positions, resolve_model
from autotune.hf.peft import adapter_settings
from autotune.hf.sharding import build_cpu_op, shards
from autotune.hf.training_args import (
    TUNED,
    BaseArguments,
    available_optimizers,
    base_arguments,
    checkpointing_field,
    read_arguments_file,
    read_json_object,
)
from autotune.launch.survey import survey_job
from autotune.system.devices import cuda_device_count, detect_device
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
    model_spec, job, base, batch = _workload(o, device_info.kind, dataset is not None)
    seq_len, target_len = _lengths(o, base, model_spec.config, job)
    slots = _check_layout(layout, batch, device_info.kind)
    budget = _budget(o.memory_budget, device_info.total_memory_bytes, len(slots), device_info.kind)
    if layout.devices and device_info.kind == DeviceKind.CUDA:  # confirm in a worker's slot
        device_info = dataclasses.replace(device_info, index=int(layout.devices[0]))
    per_process = batch // layout.nproc_per_node
    space = _space(o, base, model_spec, device_info, per_process, layout, dataset is not None)
    counted = job_counts(job) if job else _count(model_spec)
    zero = max((v for n, vs in space.levers if n == "zero_stage" for v in vs), default=0)
    check_budget(
        counted.total,
        space.precisions,
        space.optimizers,
        budget,
        split=shards(zero, layout.nproc_per_node),
        embedding=counted.embedding,
        trainable=counted.trainable,
    )
    if zero and device_info.kind == DeviceKind.CPU:
        build_cpu_op()  # once per machine; no probe pays it
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
        unmeasured_lengths=_unmeasured(job),
        recipe_settings=base.recipe,
        parameters=counted.total,
        embedding_parameters=counted.embedding,
        largest_parameter=counted.largest,
        trainable_parameters=counted.trainable,
        nproc_per_node=layout.nproc_per_node,
        data=data,
        checkpointing_field=checkpointing_field(),
        train_steps=_train_steps(o.train_steps, base),
    )
    return spec, slots


def _workload(
    o: SearchOptions, kind: DeviceKind, with_dataset: bool
) -> tuple[ModelSpec, JobFacts | None, BaseArguments, int]:
    """What is trained (the user's job, surveyed, or a stand-in from --model, maybe with a
    LoRA adapter), their arguments, and the global batch kept exactly."""
    job = survey(o, kind, with_dataset) if o.trainer else None
    base = _base(o.base_args, o.global_batch_size, job.args_class if job else "")
    batch = _global_batch(
        o.global_batch_size
        or base.global_batch_size
        or (job.per_device_train_batch_size * job.gradient_accumulation_steps if job else 0)
        or DEFAULT_GLOBAL_BATCH
    )
    model = job_model(o, job) if job else resolve_model(o.model or "", task=o.task)
    if o.lora or o.peft_config:
        model = dataclasses.replace(model, adapter=adapter_settings(o.lora, o.peft_config))
    return model, job, base, batch


def _space(
    o: SearchOptions,
    base: BaseArguments,
    model: ModelSpec,
    device: DeviceInfo,
    per_process_batch: int,
    layout: Layout,
    with_data: bool,
) -> SearchSpace:
    """The space this device, the model and the installed packages allow, narrowed by
    the options: the classic dimensions and the levers offered (and why the others not)."""
    levers, not_offered = offer(
        model,
        device.kind,
        dataset=with_data,
        fixed={k: v for k, v in base.recipe.items() if k in LEVERS},
        asked=parse_lever_options(o.levers),
        nproc_per_node=layout.nproc_per_node,
        own_deepspeed=bool(base.carried.get("deepspeed")),
    )
    return derive_space(
        device,
        global_batch_size=per_process_batch,
        precisions=o.precisions,
        optimizers=o.optimizers,
        checkpointing=tuple(c == "on" for c in o.checkpointing) if o.checkpointing else None,
        samplings=SAMPLINGS if with_data else ("random",),
        installed_optimizers=available_optimizers(),
        levers=levers,
        not_offered=not_offered,
    )


def workload_defaults(options: SearchOptions, spec: SearchSpec) -> list[str]:
    """The workload figures this search took from a default rather than from you, each
    with how to set it: a config that fits 512 tokens says little of a 4k-token run."""
    o = options
    base = _base(o.base_args, o.global_batch_size, spec.model.args_class)
    notes = []
    if spec.unmeasured_lengths:
        notes.append(spec.unmeasured_lengths)
    if spec.model.trainer and spec.parameters == 0:
        notes.append(
            "your job's base is quantized: the memory estimate does not model quantized "
            "weights, so no config is skipped by it; every config is measured"
        )
    if not (o.global_batch_size or base.global_batch_size):
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
    """The worst-case lengths probes use: asked, from --base-args, the longest sample of
    the user's job, or the model's limit."""
    limit = max_positions(config)
    seq_len = o.seq_len or base.seq_len or (job.longest or job.max_length if job else None)
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


def _base(path: Path | None, global_batch_size: int | None, args_class: str = "") -> BaseArguments:
    """What --base-args fixes: the global batch, sequence lengths, the other fields (read
    with the user's arguments class, `args_class`, when their factory takes one)."""
    if path is None:
        return BaseArguments(None, None, None, {})
    where = f"--base-args {path}"
    raw = read_arguments_file(path, option="--base-args", args_class=args_class)
    base = base_arguments(raw, where=where, args_class=args_class)
    if global_batch_size is not None and base.global_batch_size not in (None, global_batch_size):
        raise UsageError(
            f"--global-batch-size {global_batch_size} contradicts {where} "
            f"(per_device_train_batch_size x gradient_accumulation_steps = "
            f"{base.global_batch_size}); drop one of them"
        )
    return base


def survey(o: SearchOptions, device_kind: DeviceKind, with_dataset: bool) -> JobFacts:
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
    fields = {k: v for k, v in raw.items() if k not in TUNED} | {"bf16": False, "fp16": False}
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        if key in raw:
            fields[key] = raw[key]
    return survey_job(
        trainer=o.trainer or "",
        args_class=o.args_class,
        fields=fields,
        seed=o.seed,
        timeout_s=o.trial_timeout,
        use_cpu=device_kind == DeviceKind.CPU,
    )


def job_model(o: SearchOptions, job: JobFacts) -> ModelSpec:
    """The user's model as the search sees it: built by their factory in every probe."""
    task = job.task if o.task == "auto" else o.task
    if not task:
        raise UsageError(
            f"cannot tell what {job.model_class} is trained for; pass --task "
            "seq2seq|causal-lm|masked-lm|classification"
        )
    return ModelSpec(
        name=job.model_name,
        source="factory",
        task=Task(task),
        config=job.config,
        adapter=job.adapter,
        trainer=o.trainer or "",
        args_class=job.args_class,
    )


def _unmeasured(job: JobFacts | None) -> str:
    if job is None or job.longest is not None:
        return ""
    return (
        "your train dataset exposes no input_ids or length column, so probes train on "
        "the batches it gives, not on its longest samples; their peak may be below your "
        "run's: set --seq-len to your longest input for the estimate"
    )


def job_counts(job: JobFacts) -> ParameterCount:
    """The counts the estimate works from; none for a quantized base, whose weights the
    estimate (bytes per parameter by precision) does not model: every config is then
    measured rather than skipped on an estimate that would be 4-8x too high."""
    if job.quantized:
        return ParameterCount(0, 0, 0)
    trainable = job.trainable if job.trainable < job.parameters else 0
    return ParameterCount(job.parameters, job.embedding, job.largest, trainable=trainable)


def _count(model: ModelSpec) -> ParameterCount:
    """The stand-in's parameters (its --lora adapter's trainable ones among them)."""
    try:
        return count_parameters(model)
    except ValueError as exc:  # peft: a target module the model does not have
        if not model.adapter:
            raise
        first = str(exc).strip().splitlines()[0]
        raise UsageError(f"--lora: {first}; name layers {model.name} has") from None
