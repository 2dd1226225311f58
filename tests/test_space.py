from __future__ import annotations

import pytest

from autotune.core.errors import SpaceError
from autotune.probe.device import DeviceInfo, supported_precisions
from autotune.core.space import available_optimizers, batch_choices, derive_space, seed_candidates

CPU = DeviceInfo("cpu", None, "test cpu", 16 * 2**30)
A100 = DeviceInfo("cuda", 0, "A100", 80 * 2**30, (8, 0))
V100 = DeviceInfo("cuda", 0, "V100", 16 * 2**30, (7, 0))


@pytest.mark.parametrize("global_batch", [8, 16, 24, 64, 96, 256])
def test_every_candidate_keeps_the_global_batch_exactly(global_batch: int) -> None:
    space = derive_space(CPU, global_batch_size=global_batch)
    candidates = list(space.candidates())
    assert candidates
    for c in candidates:
        assert c.per_device_train_batch_size * c.gradient_accumulation_steps == global_batch


def test_batches_are_multiples_of_8_with_small_fallbacks() -> None:
    regular, fallback = batch_choices(48)
    assert regular == (8, 16, 24, 48)
    assert fallback == (1, 2, 4)


@pytest.mark.parametrize("global_batch", [12, 20, 7, 0])
def test_refuses_a_global_batch_no_allowed_batch_divides(global_batch: int) -> None:
    with pytest.raises(SpaceError):
        batch_choices(global_batch)


def test_tiny_global_batch_uses_the_small_batches() -> None:
    assert batch_choices(4) == ((1, 2, 4), ())


def test_precisions_gated_by_hardware() -> None:
    assert "tf32" not in supported_precisions(CPU)
    assert supported_precisions(V100) == ("fp32", "fp16")
    assert supported_precisions(A100) == ("fp32", "tf32", "fp16", "bf16")


def test_tf32_on_cpu_is_an_empty_space() -> None:
    with pytest.raises(SpaceError, match="supports fp32, fp16, bf16"):
        derive_space(CPU, global_batch_size=32, precisions=["tf32"])


def test_options_narrow_each_dimension() -> None:
    space = derive_space(
        A100,
        global_batch_size=64,
        precisions=["fp32", "bf16"],
        optimizers=["adamw_torch", "adafactor"],
        checkpointing=[False],
    )
    assert space.precisions == ("fp32", "bf16")
    assert space.optimizers == ("adamw_torch", "adafactor")
    assert space.checkpointing == (False,)
    assert space.size == 4 * 2 * 1 * 2


def test_unknown_optimizer_is_refused_with_the_available_ones() -> None:
    with pytest.raises(SpaceError, match=r"available: .*adamw_torch"):
        derive_space(CPU, global_batch_size=32, optimizers=["adamw_magic"])


def test_default_optimizers_are_installed_ones() -> None:
    space = derive_space(CPU, global_batch_size=32)
    installed = available_optimizers()
    assert {"adamw_torch", "adamw_torch_fused", "adafactor"} <= set(space.optimizers)
    assert set(space.optimizers) <= set(installed)
    assert ("adamw_bnb_8bit" in space.optimizers) == ("adamw_bnb_8bit" in installed)


def test_seeds_start_from_the_plain_default_and_prefer_64_on_ampere() -> None:
    space = derive_space(A100, global_batch_size=256)
    seeds = seed_candidates(space, A100)
    assert seeds[0].per_device_train_batch_size == 8 and seeds[0].precision == "fp32"
    assert seeds[1].per_device_train_batch_size % 64 == 0 and seeds[1].precision == "bf16"
