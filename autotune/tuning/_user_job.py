"""The user's own job (--trainer), surveyed once (tuning/resolve.py), turned into what
the plan needs: the study's model, the counts the estimate works from (each parameter
as it is held),
their recipe (their arguments in their class, its defaults included), what of the space
their job fixes, and what identifies the job a study searched."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.core.checkpointing import Checkpointing
from autotune.core.enums import Task
from autotune.core.errors import UsageError
from autotune.core.job import JobFacts, ParameterCount
from autotune.core.optimizers import DEFAULT as DEFAULT_OPTIMIZERS
from autotune.core.optimizers import FOR_QUANTIZED_BASE
from autotune.core.recipe import Recipe
from autotune.core.trial import ModelSpec
from autotune.tuning.options import SearchOptions

# What of the classic dimensions a user's job can rule out, as the space's "not offered"
# list names it: the search's first lines and `show` say why
NO_CHECKPOINTING = f"checkpointing {Checkpointing.OFF}"  # core/checkpointing.offered
NO_FP32 = "fp32"
NO_FP16 = "fp16"
NO_OPTIMIZERS = "optimizers"
FIXED_BY_JOB = (NO_CHECKPOINTING, NO_FP32, NO_FP16, NO_OPTIMIZERS)


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


def job_counts(job: JobFacts) -> ParameterCount:
    """The counts the estimate works from, each parameter as the job holds it: a frozen
    bf16 base at 2 bytes a parameter, a 4-bit one at its packed storage and scales."""
    trainable = job.trainable if job.trainable < job.parameters else 0
    return ParameterCount(
        job.parameters,
        job.embedding,
        job.largest,
        trainable=trainable,
        frozen_bytes=job.frozen_bytes if trainable else 0,
        checkpoint_layers=job.checkpoint_layers,
    )


def job_recipe(job: JobFacts | None, file_recipe: dict[str, Any]) -> dict[str, Any]:
    """The user's recipe: the tuned fields of their arguments as their class builds them
    (SFTConfig's bf16, fused AdamW and checkpointing when their file is silent), their
    file's own values over those."""
    if job is None:
        return file_recipe
    return {**job.recipe, **file_recipe}


def job_optimizers(
    asked: tuple[str, ...] | None,
    installed: tuple[str, ...],
    recipe: dict[str, Any],
    job: JobFacts,
) -> tuple[str, ...] | None:
    """The optimizers searched for the user's job: what --optimizers asked, else the
    defaults with their own `optim` (it is the reference), and bitsandbytes' 8-bit and
    paged optimizers for a quantized base where bitsandbytes is installed. A Trainer
    built with its own optimizer trains that in every probe: only their `optim` then."""
    own = recipe.get("optim")
    if job.own_optimizer:
        return (Recipe(recipe).optim,)
    if asked:
        return asked
    extra = [o for o in FOR_QUANTIZED_BASE if o in installed] if job.quantization else []
    defaults = [o for o in DEFAULT_OPTIMIZERS if o in installed]
    wanted = (*defaults, *([own] if isinstance(own, str) else []), *extra)
    return tuple(dict.fromkeys(wanted))


def held_in(job: JobFacts | None) -> str:
    """What the job holds its weights in when that is not 32 bits ("4-bit nf4",
    "bfloat16"): its runs without autocast then compute in that, and are `as-loaded`;
    "" for a job held in fp32, whose runs without autocast are fp32."""
    return narrowest(job.held) if job is not None else ""


def narrowest(held: Mapping[str, Any]) -> str:
    """The narrowest kind the parameters are held in (JobFacts.held, as a study's
    job profile keeps it) where not 32 bits: `held_in`."""
    kinds = [key.split(" ", 1)[1] for key in held]
    narrow = [k for k in kinds if "bit" in k or k in ("bfloat16", "float16")]
    return next((k for k in narrow if "bit" in k), narrow[0] if narrow else "")


def trains_in(job: JobFacts | None) -> str:
    """The 16-bit dtype the job's trainable parameters are held in ("bfloat16": SFTTrainer
    casts a quantized model's adapters so), or "" where they train in 32 bits."""
    kinds = [
        key.split(" ", 1)[1] for key in (job.held if job else {}) if key.startswith("trainable")
    ]
    return next((k for k in kinds if k in ("bfloat16", "float16")), "")


def fixed_by_job(job: JobFacts | None, offers_fp16: bool) -> list[tuple[str, str]]:
    """What of the precisions and optimizers the user's job rules out, each with why, as
    the space's "not offered" list holds it: fp32 on weights not held in 32 bits, fp16
    (where the device `offers_fp16`) on trainable parameters held in 16 bits, the
    optimizer when their Trainer brings its own. (Checkpointing off, for a job that
    turns it on itself: core/checkpointing.offered.)"""
    fixed = []
    if job is not None and job.own_optimizer:
        fixed.append(
            (
                NO_OPTIMIZERS,
                f"your factory builds the Trainer with its own {job.own_optimizer} "
                "(optimizers=): every probe trains it whatever optim says, so optim is not "
                "searched",
            )
        )
    if held := held_in(job):
        fixed.append(
            (
                NO_FP32,
                f"your job holds its weights in {held}: without autocast they compute in "
                "that, so those runs are called as-loaded",
            )
        )
    if offers_fp16 and (trained := trains_in(job)):
        fixed.append(
            (
                NO_FP16,
                f"your job trains its parameters in {trained} (SFTTrainer casts a quantized "
                "model's adapters so): fp16's gradient scaler unscales only fp32 gradients, "
                "so an fp16 run would fail at its first step",
            )
        )
    return fixed


def job_profile(job: JobFacts | None) -> dict[str, Any]:
    """What the factory built that its study is bound to: the parameters as held, the
    quantization, what trains, the save methods their Trainer overrides, and the data's
    lengths. A job edited from a 4-bit to a bf16 base, or given other data, is another
    search, never a resume."""
    if job is None:
        return {}
    profile = {
        "held": job.held,
        "quantization": job.quantization,
        "trainable": job.trainable,
        "forced_checkpointing": job.forced_checkpointing,
        "own_save": job.own_save,
        "fused_head": job.fused_head,
        "lengths": {"longest": job.longest, "samples": job.samples, "tokens": job.tokens},
    }
    return {k: v for k, v in profile.items() if v}


def unmeasured(job: JobFacts | None) -> str:
    if job is None or job.longest is not None:
        return ""
    return (
        "your train dataset exposes no input_ids or length column, so probes train on "
        "the batches it gives, not on its longest samples; their peak may be below your "
        "run's: set --seq-len to your longest input for the estimate"
    )
