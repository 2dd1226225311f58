"""The user's job as the plan reads it: the optimizer and checkpointing it allows, its
recipe in its own class, and what binds a study to it."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import SPEC

from autotune.core.device import DeviceInfo
from autotune.core.errors import SpaceError
from autotune.core.job import JobFacts
from autotune.core.space import derive_space
from autotune.tuning._user_job import (
    fixed_by_job,
    held_in,
    job_counts,
    job_optimizers,
    job_profile,
    job_recipe,
    trains_in,
)

INSTALLED = ("adamw_torch", "adamw_torch_fused", "adafactor", "adamw_bnb_8bit", "paged_adamw_8bit")
BF16 = JobFacts(
    args_class="trl.SFTConfig",
    args_fields=(),
    model_name="mine",
    model_class="LlamaForCausalLM",
    task="causal-lm",
    config={},
    parameters=1_000_000,
    trainable=10_000,
    embedding=64_000,
    largest=64_000,
    held={"frozen bfloat16": 990_000, "trainable float32": 10_000},
    frozen_bytes=1_980_000,
    longest=64,
    samples=120,
    tokens=4000,
    recipe={"bf16": True, "optim": "adamw_torch_fused", "activation_checkpointing": True},
)
QLORA = dataclasses.replace(
    BF16,
    held={"frozen 4-bit nf4": 900_000, "frozen float32": 90_000, "trainable bfloat16": 10_000},
    frozen_bytes=860_000,
    quantization={"bits": 4, "quant_type": "nf4", "compute_dtype": "bfloat16"},
    forced_checkpointing=True,
)


def test_the_users_own_optimizer_is_always_searched_and_a_quantized_base_gets_paged_ones() -> None:
    recipe = {"optim": "paged_adamw_8bit"}
    plain = job_optimizers(None, INSTALLED, recipe, BF16)
    assert plain is not None and "paged_adamw_8bit" in plain  # theirs, kept as the reference
    quantized = job_optimizers(None, INSTALLED, {}, QLORA)
    assert quantized is not None and {"paged_adamw_8bit", "adamw_bnb_8bit"} <= set(quantized)
    assert "paged_adamw_32bit" not in quantized  # not installed here
    assert job_optimizers(("sgd",), INSTALLED, recipe, QLORA) == ("sgd",)  # asked: as asked


def test_the_recipe_is_their_class_with_its_defaults_under_their_file() -> None:
    assert job_recipe(BF16, {"optim": "adamw_torch"}) == {
        "bf16": True,  # SFTConfig's default, which their file left alone
        "optim": "adamw_torch",
        "activation_checkpointing": True,
    }
    assert job_recipe(None, {"optim": "sgd"}) == {"optim": "sgd"}


def test_a_job_edited_from_4bit_to_bf16_is_another_study() -> None:
    spec = dataclasses.replace(SPEC, model=dataclasses.replace(SPEC.model, trainer="j.py:f"))
    four_bit = dataclasses.replace(spec, job_profile=job_profile(QLORA))
    bf16 = dataclasses.replace(spec, job_profile=job_profile(BF16))
    assert four_bit.identity() != bf16.identity()
    assert four_bit.measurement_identity() != bf16.measurement_identity()  # no peak reused
    other_data = dataclasses.replace(BF16, longest=128)
    assert dataclasses.replace(spec, job_profile=job_profile(other_data)).identity() != (
        bf16.identity()
    )
    assert "job" not in SPEC.identity()  # a --model study resumes as it did


def test_the_estimate_counts_a_quantized_base_as_held() -> None:
    counted = job_counts(QLORA)
    assert (counted.total, counted.trainable, counted.frozen_bytes) == (1_000_000, 10_000, 860_000)


def test_adapters_trained_in_bf16_are_offered_no_fp16_on_a_gpu() -> None:
    # SFTTrainer casts a quantized model's adapters to bf16; fp16's GradScaler then fails
    # at the first step ("_amp_foreach_non_finite_check_and_unscale_cuda" not implemented
    # for 'BFloat16', seen on an H100): no such probe is launched
    h100 = DeviceInfo("cuda", 0, "H100", 80 * 2**30, (9, 0))

    def space(job: JobFacts, **asked: object):
        return derive_space(
            h100,
            global_batch_size=16,
            installed_optimizers=INSTALLED,
            held_in=held_in(job),
            trains_in=trains_in(job),
            **asked,  # type: ignore[arg-type]
        )

    assert space(QLORA).precisions == ("as-loaded", "bf16")
    assert [name for name, _ in fixed_by_job(QLORA, offers_fp16=True)] == ["fp32", "fp16"]
    assert "gradient scaler" in dict(fixed_by_job(QLORA, offers_fp16=True))["fp16"]
    assert "fp16" not in dict(fixed_by_job(QLORA, offers_fp16=False))  # the CPU has none
    with pytest.raises(SpaceError, match="--precisions fp16: your job trains its parameters"):
        space(QLORA, precisions=["fp16"])
    assert space(BF16).precisions == ("as-loaded", "fp16", "bf16")  # fp32 adapters: it can


def test_a_trainer_with_its_own_optimizer_fixes_the_optimizer_to_theirs() -> None:
    own = dataclasses.replace(BF16, own_optimizer="SGD")
    assert job_optimizers(None, INSTALLED, {"optim": "sgd"}, own) == ("sgd",)
    assert job_optimizers(("adafactor",), INSTALLED, {}, own) == ("adamw_torch",)


def test_their_tf32_and_sampling_are_kept_where_autotune_does_not_search_them() -> None:
    from autotune.core.enums import DeviceKind
    from autotune.core.space import derive_space
    from autotune.hf.training_args import tuned_arguments

    cuda = DeviceKind.CUDA
    bf16 = SPEC.space.candidate(8, "bf16", False, "adamw_torch")
    assert tuned_arguments(bf16, device_kind=cuda, tf32_kept=True)["tf32"] is True
    assert tuned_arguments(bf16, device_kind=cuda)["tf32"] is False
    fp32 = SPEC.space.candidate(8, "fp32", False, "adamw_torch")
    assert tuned_arguments(fp32, device_kind=cuda, tf32_kept=True)["tf32"] is False  # fp32 is fp32
    space = derive_space(
        SPEC.device,
        global_batch_size=16,
        samplings=("group_by_length",),  # their train_sampling_strategy, not searched
        installed_optimizers=INSTALLED,
    )
    assert {c.train_sampling_strategy for c in space.candidates()} == {"group_by_length"}
    assert space.candidate(8, "fp32", False, "adamw_torch").train_sampling_strategy == (
        "group_by_length"
    )
