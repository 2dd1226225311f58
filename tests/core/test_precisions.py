"""Each precision is one declaration: the flags a candidate sets, the precisions a device
offers, the recipe's precision read back, the estimate and parity follow from it."""

from __future__ import annotations

import dataclasses

from transformers import TrainingArguments

from autotune.core.enums import DeviceKind, Precision
from autotune.core.parity import Arithmetic
from autotune.core.precisions import (
    DECLARED,
    FLAGS,
    MIXED_FLAGS,
    flags,
    from_fields,
    on_device,
    precision_spec,
)
from autotune.core.trial import Candidate
from autotune.hf.training_args import tuned_arguments
from autotune.tuning.estimate import weight_bytes


def test_every_precision_is_declared_once_and_its_flags_are_trainingarguments_fields() -> None:
    assert [spec.precision for spec in DECLARED] == list(Precision)
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set(FLAGS) <= fields and MIXED_FLAGS == ("fp16", "bf16")


def test_a_device_offers_what_it_has_the_units_for() -> None:
    assert on_device(DeviceKind.CPU, None) == (Precision.FP32, Precision.BF16)
    assert on_device(DeviceKind.CUDA, (7, 0)) == (Precision.FP32, Precision.FP16)
    ampere = (Precision.FP32, Precision.TF32, Precision.FP16, Precision.BF16)
    assert on_device(DeviceKind.CUDA, (9, 0)) == ampere
    # as-loaded is the job's to offer, never a device's
    assert Precision.AS_LOADED not in on_device(DeviceKind.CUDA, (9, 0))


def test_a_precision_sets_its_own_flag_and_reads_back_from_it() -> None:
    for spec in DECLARED:
        set_ = flags(spec.precision)
        assert [flag for flag, on in set_.items() if on] == ([spec.flag] if spec.flag else [])
        expected = Precision.FP32 if spec.precision == Precision.AS_LOADED else spec.precision
        assert from_fields(set_) == expected
    # the recipe's TF32 is kept under mixed precision (its 32-bit matmuls), not under fp32
    assert flags("bf16", tf32_kept=True) == {"fp16": False, "bf16": True, "tf32": True}
    assert flags("fp32", tf32_kept=True)["tf32"] is False
    assert from_fields({"bf16": True, "tf32": True}) == Precision.BF16


def test_the_candidates_fields_are_the_precisions_flags() -> None:
    for precision in ("fp32", "tf32", "fp16", "bf16"):
        candidate = Candidate(8, 1, precision, False, "adamw_torch")
        cuda = tuned_arguments(candidate, device_kind=DeviceKind.CUDA)
        assert {flag: cuda[flag] for flag in FLAGS} == flags(precision)
        cpu = tuned_arguments(candidate, device_kind=DeviceKind.CPU)
        assert "tf32" not in cpu and cpu["use_cpu"] is True


def test_the_estimate_and_parity_read_the_declarations() -> None:
    assert weight_bytes(100, "fp32") == 400 and weight_bytes(100, "bf16") == 600
    assert precision_spec("fp32").activation_scale == 2 * precision_spec("bf16").activation_scale
    assert [spec.precision for spec in DECLARED if spec.scales_gradients] == [Precision.FP16]
    # a 16-bit config under ZeRO is DeepSpeed's arithmetic; an fp32 one stays the Trainer's
    zero = Candidate(8, 1, "bf16", False, "adamw_torch", zero_stage=2)
    assert Arithmetic.of(zero).engine == "deepspeed"
    assert Arithmetic.of(dataclasses.replace(zero, precision="fp32")).engine == ""
