"""From the user's options to a SearchSpec: every check first, then anything written.

The job is resolved once into typed facts (`tuning/resolve.py`: the device, the model and
its parameters as held, the user's job from the survey, their arguments, what the
device and the installed packages offer); the plan is derived from those facts alone and
checked (the worker layout, the budget); only when all of that holds is the user's
dataset tokenized.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autotune.core import checkpointing
from autotune.core.device import supported_precisions
from autotune.core.enums import DeviceKind, Precision, Task
from autotune.core.errors import UsageError
from autotune.core.job import BaseArguments, JobFacts, ParameterCount, SurveyServer
from autotune.core.levers import BY_NAME, shards
from autotune.core.recipe import Recipe
from autotune.core.space import SAMPLINGS, SearchSpace, derive_space
from autotune.core.spec import SearchSpec
from autotune.tuning._user_job import (
    FIXED_BY_JOB,
    fixed_by_job,
    held_in,
    job_optimizers,
    job_profile,
    trains_in,
    unmeasured,
)
from autotune.tuning.estimate import check_budget
from autotune.tuning.options import AskedWorkload, SearchOptions
from autotune.tuning.resolve import DataOptions, Facts, build_zero_op, resolve, tokenize
from autotune.tuning.time_plan import measure_steps_for
from autotune.tuning.workers import Slot, plan_slots

DEFAULT_GLOBAL_BATCH = 32
DEFAULT_TARGET_LEN = 128
MAX_GLOBAL_BATCH = 1 << 20  # a million samples per optimizer step is past any real recipe


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the search uses the machine: DDP processes per probe, worker slots."""

    nproc_per_node: int = 1
    parallel: int = 1
    devices: tuple[str, ...] | None = None
    nnodes: int = 1

    @classmethod
    def of(cls, options: SearchOptions) -> Layout:
        return cls(options.nproc_per_node, options.parallel, options.devices, options.nnodes)

    @property
    def processes(self) -> int:
        """A probe's processes on every node."""
        return self.nproc_per_node * self.nnodes


def build_spec(
    options: SearchOptions,
    *,
    layout: Layout = Layout(),
    dataset: DataOptions | None = None,
    server: SurveyServer | None = None,
) -> tuple[SearchSpec, list[Slot], list[str]]:
    """Validate every option against the job and the device; raise UsageError if off.
    Returns the spec, the worker slots and what the plan took from a default or the
    user's job fixes (the search's first lines).

    With a dataset, it is tokenized once into `dataset.out_dir`, after every check; a
    sequence length not given is then the data's longest (--seq-len caps it)."""
    o = options
    facts = resolve(
        o, nproc_per_node=layout.processes, with_dataset=dataset is not None, server=server
    )
    spec, slots = plan(o, facts, layout, with_dataset=dataset is not None)
    build_zero_op(spec.space, spec.device.kind)
    if dataset is not None:  # the first write: every check has passed
        data, seq_len, target_len = tokenize(dataset, o, facts, spec.space, spec.target_len)
        spec = dataclasses.replace(spec, data=data, seq_len=seq_len, target_len=target_len)
    return spec, slots, workload_defaults(o.workload, spec, facts.base) + job_notes(spec)


def plan(
    o: SearchOptions, facts: Facts, layout: Layout, *, with_dataset: bool
) -> tuple[SearchSpec, list[Slot]]:
    """The spec the facts and the options make, every check passed: the global batch
    kept exactly, the lengths, the worker slots, the budget, the space."""
    device, base, job, counted = facts.device, facts.base, facts.job, facts.counted
    batch = _global_batch(o.workload, base, job, layout.processes)
    seq_len, target_len = _lengths(o.workload, base, facts, job)
    slots = _check_layout(layout, batch, device.kind, facts.gpus)
    budget = _budget(o.memory_budget, device.total_memory_bytes, len(slots), device.kind)
    if layout.devices and device.kind == DeviceKind.CUDA:  # confirm in a worker's slot
        device = dataclasses.replace(device, index=int(layout.devices[0]))
    space = _space(o.precisions, o.optimizers, facts, batch // layout.processes, with_dataset)
    space = _graded(space, o.checkpointing, counted.checkpoint_layers, device.kind, job)
    _check_budget(counted, space, budget, layout.processes)
    spec = SearchSpec(
        model=facts.model,
        device=device,
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
        longest_samples=job.longest_samples[:batch] if job else (),
        recipe_settings=facts.recipe,
        parameters=counted.total,
        embedding_parameters=counted.embedding,
        largest_parameter=counted.largest,
        trainable_parameters=counted.trainable,
        frozen_bytes=counted.frozen_bytes,
        job_profile=job_profile(job),
        nproc_per_node=layout.nproc_per_node,
        nnodes=layout.nnodes,
        checkpointing_field=facts.checkpointing_field,
        train_steps=_train_steps(o.train_steps, base),
        packed_len=(job.max_length or 0) if job and space.changes_samples else 0,
    )
    return spec, slots


def _graded(
    space: SearchSpace,
    asked: Sequence[str] | None,
    layers: int | None,
    kind: DeviceKind,
    job: JobFacts | None,
) -> SearchSpace:
    """The space with the checkpointing levels the model, the device and the job offer
    (and why not the others), narrowed to those asked for (core/checkpointing.py)."""
    forced = job is not None and job.forced_checkpointing
    levels, why = checkpointing.offered(layers, kind, forced=forced)
    try:
        levels = checkpointing.narrowed(levels, why, asked, forced=forced)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return dataclasses.replace(space, checkpointing=levels, not_offered=(*space.not_offered, *why))


def _check_budget(counted: ParameterCount, space: SearchSpace, budget: int, nproc: int) -> None:
    """Refuse a budget the job as built cannot fit (each parameter as it is held)."""
    # the most any sharding searched splits the state (ZeRO's stages, FSDP's modes)
    stage = max(
        (BY_NAME[name].shard_stage(value) for name, values in space.levers for value in values),
        default=0,
    )
    check_budget(
        counted.total,
        space.precisions,
        space.optimizers,
        budget,
        split=shards(stage, nproc),
        embedding=counted.embedding,
        trainable=counted.trainable,
        frozen_bytes=counted.frozen_bytes,
    )


def _global_batch(
    asked: AskedWorkload, base: BaseArguments, job: JobFacts | None, nproc: int
) -> int:
    """The global batch kept exactly: --global-batch-size, else their arguments'
    per-device batch x accumulation x the processes that run it."""
    per_process = base.process_batch_size or (
        job.per_device_train_batch_size * job.gradient_accumulation_steps if job else 0
    )
    batch = asked.global_batch_size or per_process * nproc or DEFAULT_GLOBAL_BATCH
    if batch > MAX_GLOBAL_BATCH:
        raise UsageError(
            f"--global-batch-size {batch} is over the limit of {MAX_GLOBAL_BATCH}; "
            "give the samples per optimizer step"
        )
    return batch


def _space(
    precisions: tuple[str, ...] | None,
    optimizers: tuple[str, ...] | None,
    facts: Facts,
    per_process_batch: int,
    with_dataset: bool,
) -> SearchSpace:
    """The space this device, the model, the user's job and the installed packages allow,
    narrowed by the options: the classic dimensions and the levers offered (and why the
    others not)."""
    job, recipe, installed = facts.job, facts.recipe, facts.installed_optimizers
    offers_fp16 = Precision.FP16 in supported_precisions(facts.device)
    optimizers = job_optimizers(optimizers, installed, recipe, job) if job else optimizers
    sampling = Recipe(recipe).sampling
    return derive_space(
        facts.device,
        global_batch_size=per_process_batch,
        precisions=precisions,
        optimizers=optimizers,
        samplings=SAMPLINGS if with_dataset else (sampling,),
        installed_optimizers=installed,
        levers=facts.levers,
        not_offered=(*facts.levers_not_offered, *fixed_by_job(job, offers_fp16)),
        held_in=held_in(job),
        trains_in=trains_in(job),
    )


def job_notes(spec: SearchSpec) -> list[str]:
    """What the user's job fixes of the classic dimensions, and why (their factory turns
    checkpointing on; their weights are not held in 32 bits)."""
    return [f"{name}: {why}" for name, why in spec.space.not_offered if name in FIXED_BY_JOB]


def workload_defaults(asked: AskedWorkload, spec: SearchSpec, base: BaseArguments) -> list[str]:
    """The workload figures this search took from a default rather than from you (nor
    from your arguments file, `base`), each with how to set it: a config that fits 512
    tokens says little of a 4k-token run."""
    o = asked
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


def _lengths(
    o: AskedWorkload, base: BaseArguments, facts: Facts, job: JobFacts | None = None
) -> tuple[int, int]:
    """The worst-case lengths probes use: for the user's job whose data gives its lengths,
    what its probes train on (its longest sample, cut at their max_length); else asked,
    from --base-args, their max_length, or the model's limit."""
    limit = facts.max_positions
    if job is not None and job.longest is not None:
        trained = min(job.longest, job.max_length or job.longest)
        return trained, o.target_len or base.target_len or DEFAULT_TARGET_LEN
    seq_len = o.seq_len or base.seq_len or (job.max_length if job else None)
    if seq_len is None:
        seq_len = min(512, limit or 512)
    elif limit is not None and seq_len > limit:
        raise UsageError(
            f"--seq-len {seq_len} exceeds {facts.model.name}'s limit of {limit} positions"
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


def _check_layout(
    layout: Layout, global_batch_size: int, kind: DeviceKind, gpus: int
) -> list[Slot]:
    """DDP needs a batch the processes share evenly, and the GPUs; workers need slots."""
    n = layout.processes
    if n > 1 and (layout.parallel > 1 or layout.devices):
        raise UsageError(
            "--nproc-per-node runs each probe on several devices already; "
            "drop --parallel/--devices, or run several searches on one --storage"
        )
    if n > 1 and global_batch_size % n:
        by = f"--nproc-per-node {n}"
        if layout.nnodes > 1:
            by = f"the {n} processes of --nnodes {layout.nnodes}"
        raise UsageError(
            f"--global-batch-size {global_batch_size} is not divisible by {by}; each "
            "process takes an equal share of the batch"
        )
    local = layout.nproc_per_node
    if local > 1 and kind == DeviceKind.CUDA and gpus < local:
        raise UsageError(f"--nproc-per-node {local} needs {local} GPUs; {gpus} visible")
    if layout.parallel > 1 or layout.devices:
        return plan_slots(kind, layout.parallel, layout.devices, gpus)
    return []
