from __future__ import annotations

from pathlib import Path

import pytest

from autotune.core.checkpointing import Checkpointing
from autotune.core.device import DeviceInfo, supported_precisions
from autotune.core.errors import SpaceError
from autotune.core.space import SearchSpace, batch_choices, derive_space, seed_candidates
from autotune.hf.training_args import available_optimizers

CPU = DeviceInfo("cpu", None, "test cpu", 16 * 2**30)
A100 = DeviceInfo("cuda", 0, "A100", 80 * 2**30, (8, 0))
V100 = DeviceInfo("cuda", 0, "V100", 16 * 2**30, (7, 0))
INSTALLED = available_optimizers()


def derive(device: DeviceInfo, **options: object) -> SearchSpace:
    return derive_space(device, installed_optimizers=INSTALLED, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("global_batch", [8, 16, 24, 64, 96, 256])
def test_every_candidate_keeps_the_global_batch_exactly(global_batch: int) -> None:
    space = derive(CPU, global_batch_size=global_batch)
    candidates = list(space.candidates())
    assert candidates
    for c in candidates:
        assert c.per_device_train_batch_size * c.gradient_accumulation_steps == global_batch


def test_batches_are_multiples_of_8_with_small_fallbacks() -> None:
    regular, fallback = batch_choices(48)
    assert regular == (8, 16, 24, 48)
    assert fallback == (1, 2, 4)


@pytest.mark.parametrize(
    ("global_batch", "says"),
    [(12, "e.g. 8 or 16"), (20, "e.g. 16 or 24"), (7, "e.g. 8 or 16"), (0, "must be positive")],
)
def test_refuses_a_global_batch_no_allowed_batch_divides(global_batch: int, says: str) -> None:
    with pytest.raises(SpaceError, match=says):
        batch_choices(global_batch)


def test_tiny_global_batch_uses_the_small_batches() -> None:
    assert batch_choices(4) == ((1, 2, 4), ())


def test_precisions_gated_by_hardware() -> None:
    # fp16 on the CPU would train in fp32: accelerate runs its autocast on GPUs only
    assert supported_precisions(CPU) == ("fp32", "bf16")
    assert supported_precisions(V100) == ("fp32", "fp16")
    assert supported_precisions(A100) == ("fp32", "tf32", "fp16", "bf16")


def test_tf32_on_cpu_is_an_empty_space() -> None:
    with pytest.raises(SpaceError, match="supports fp32, bf16"):
        derive(CPU, global_batch_size=32, precisions=["tf32"])


def test_options_narrow_each_dimension() -> None:
    space = derive(
        A100,
        global_batch_size=64,
        precisions=["fp32", "bf16"],
        optimizers=["adamw_torch", "adafactor"],
        checkpointing=[False],
    )
    assert space.precisions == ("fp32", "bf16")
    assert space.optimizers == ("adamw_torch", "adafactor")
    assert space.checkpointing == (Checkpointing.OFF,)
    # "probe n of N" counts this: every regular config, each once
    regular = list(space.candidates(include_fallback=False))
    assert space.size == len(regular) == len(set(regular)) == 16


def test_unknown_optimizer_is_refused_with_the_available_ones() -> None:
    with pytest.raises(SpaceError, match=r"available: .*adamw_torch"):
        derive(CPU, global_batch_size=32, optimizers=["adamw_magic"])


def test_default_optimizers_are_installed_ones() -> None:
    space = derive(CPU, global_batch_size=32)
    installed = available_optimizers()
    assert {"adamw_torch", "adamw_torch_fused", "adafactor"} <= set(space.optimizers)
    assert set(space.optimizers) <= set(installed)
    assert ("adamw_bnb_8bit" in space.optimizers) == ("adamw_bnb_8bit" in installed)


def test_seeds_start_from_the_plain_default_and_align_tokens_on_ampere() -> None:
    space = derive(A100, global_batch_size=256)
    seeds = seed_candidates(space, A100, tokens_per_sample=100)
    assert seeds[0].per_device_train_batch_size == 8 and seeds[0].precision == "fp32"
    # 100 tokens a sample: 16 x 100 = 1600 = 25 x 64 tiles; 24 x 100 is not a multiple.
    fast = seeds[1].per_device_train_batch_size
    assert (fast * 100) % 64 == 0 and seeds[1].precision == "bf16"
    assert fast == max(b for b in space.micro_batches if (b * 100) % 64 == 0)


def test_a_cpu_with_bf16_instructions_guesses_bf16_early_and_another_fp32() -> None:
    """On a CPU whose bf16 dot products are native (avx512_bf16: this AMD EPYC, where
    bf16 runs mt5-small 1.3x fp32) the second guess is bf16; elsewhere bf16 is emulated
    and the guess stays fp32."""
    import dataclasses

    space = derive(CPU, global_batch_size=16)
    native = dataclasses.replace(CPU, native_bf16=True)
    assert seed_candidates(space, native)[1].precision == "bf16"
    assert seed_candidates(space, CPU)[1].precision == "fp32"
    fp32_only = derive(native, global_batch_size=16, precisions=["fp32"])
    assert seed_candidates(fp32_only, native)[1].precision == "fp32"


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    from autotune.system.devices import NATIVE_BF16, cpu_flags

    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: AMD EPYC\nflags\t\t: fpu avx512f avx512_bf16\n")
    assert cpu_flags(info) & NATIVE_BF16 == {"avx512_bf16"}
    info.write_text("model name\t: Xeon\nflags\t\t: fpu avx2\n")
    assert not cpu_flags(info) & NATIVE_BF16
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_the_alignment_rule_applies_at_a_small_global_batch() -> None:
    """At a global batch of 32 no per-device batch is a multiple of 64 samples, but at
    512 tokens a sample every one is a multiple of 64 tokens: the largest is the guess."""
    space = derive(A100, global_batch_size=32)
    assert seed_candidates(space, A100, tokens_per_sample=512)[1].per_device_train_batch_size == 32


@pytest.mark.parametrize("asked", ["fp32", "tf32"])
def test_no_autocast_on_a_job_held_in_16_bits_is_asked_for_by_its_own_name(asked: str) -> None:
    """`--precisions fp32` on a bf16-held job would name arithmetic it does not do: the
    error gives the flag that runs it without autocast, and that flag is taken."""
    with pytest.raises(SpaceError, match="pass --precisions as-loaded"):
        derive(A100, global_batch_size=16, precisions=[asked], held_in="bfloat16")
    space = derive(A100, global_batch_size=16, precisions=["as-loaded"], held_in="bfloat16")
    assert [p.value for p in space.precisions] == ["as-loaded"]
