"""Each precision, declared once: how it runs and what the plan, the probe, the estimate
and parity must know of it.

A precision is one record: the `TrainingArguments` flag that turns it on, the dtype the
Trainer's autocast computes in (mixed precision), whether fp32 matmuls run on TF32
tensor cores, the bytes a trained parameter's weights and a saved activation take in
the estimate, and the devices it runs on (the CPU; the CUDA capability it needs). The
`TrainingArguments` fields a candidate sets, the precisions a device offers, the
recipe's precision read back from a user's file, the peak FLOP/s a probe is measured
against, the estimate and parity's class read these records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.core.enums import DeviceKind, Precision


@dataclasses.dataclass(frozen=True)
class PrecisionSpec:
    precision: Precision
    flag: str = ""  # the TrainingArguments flag that turns it on ("": none is set)
    autocast: str = ""  # the torch dtype autocast computes in ("": no autocast)
    tf32_matmuls: bool = False  # fp32 matmuls on TF32 tensor cores
    # The estimate (Hugging Face's single-GPU training guide): a trained parameter's
    # weights (fp32, or an fp32 master and a 16-bit copy under mixed precision), and a
    # saved activation's size against a 16-bit one
    weight_bytes: int = 4
    activation_scale: int = 1
    # the same on the CPU, where autocast saves less: the fp32 residual stream and the
    # casts stay alive (None: as on a GPU)
    cpu_activation_scale: float | None = None
    # Its gradient scaler unscales fp32 gradients only: not for a job whose trainable
    # parameters are held in 16 bits
    scales_gradients: bool = False
    on_cpu: bool = False  # trains as named on the CPU
    cuda_capability: tuple[int, int] | None = None  # the least a GPU needs; None: no GPU

    @property
    def mixed(self) -> bool:
        """16-bit arithmetic under autocast, with fp32 weights kept for the update."""
        return bool(self.autocast)

    def saved_scale(self, device_kind: str) -> float:
        """A saved activation's size against a 16-bit one on this device (`cpu_activation_scale`
        on the CPU, where declared)."""
        if device_kind != DeviceKind.CUDA and self.cpu_activation_scale is not None:
            return self.cpu_activation_scale
        return self.activation_scale


DECLARED = (
    PrecisionSpec(Precision.FP32, activation_scale=2, on_cpu=True, cuda_capability=(0, 0)),
    # a CUDA tensor-core mode: TrainingArguments refuses it without Ampere
    PrecisionSpec(
        Precision.TF32,
        flag="tf32",
        tf32_matmuls=True,
        activation_scale=2,
        cuda_capability=(8, 0),
    ),
    # accepted on the CPU but trained in fp32 there: accelerate enables fp16 autocast only
    # on GPU-like devices (Accelerator.native_amp; accelerate 1.x, transformers 5.24), so
    # an "fp16" config would be fp32 under another name
    PrecisionSpec(
        Precision.FP16,
        flag="fp16",
        autocast="float16",
        weight_bytes=6,
        cpu_activation_scale=2,
        cuda_capability=(6, 0),
        scales_gradients=True,
    ),
    # Peaks on the CPU of models built in fp32, less what the process, the job's setup and
    # the static terms held (benchmarks/memory_terms.py, batch 4-16): bf16's 0.87-0.99 of
    # fp32's for a small GPT-2, 0.85-0.93 for BERT, 0.92-1.05 for T5, against the half the
    # 16-bit rule says. 0.85, the most it saved, so the estimate still errs towards
    # "might fit"; checkpointed, 0.76-1.0 (a term that reads 1.4-2.8x the plain one
    # anyway). A job held in 16 bits keeps the rule: tuning/estimate.activation_bytes
    PrecisionSpec(
        Precision.BF16,
        flag="bf16",
        autocast="bfloat16",
        weight_bytes=6,
        cpu_activation_scale=1.7,
        on_cpu=True,
        cuda_capability=(8, 0),
    ),
    # no autocast on a job held in 16 bits or quantized: its weights' own dtype (offered
    # by the job, not the device); its trained adapters in fp32, as PEFT makes them (in
    # bf16 where TRL casts a quantized model's: the survey counts them as held)
    PrecisionSpec(Precision.AS_LOADED),
)
BY_PRECISION = {spec.precision: spec for spec in DECLARED}
BY_FLAG = {spec.flag: spec.precision for spec in DECLARED if spec.flag}
# The flags TrainingArguments checks against the machine's hardware, in the order a
# recipe's precision is read from them
FLAGS = ("bf16", "fp16", "tf32")
MIXED_FLAGS = tuple(spec.flag for spec in DECLARED if spec.mixed)  # autocast's: fp16, bf16


def precision_spec(precision: str) -> PrecisionSpec:
    return BY_PRECISION[Precision(precision)]


def flags(precision: str, *, tf32_kept: bool = False) -> dict[str, bool]:
    """The precision flags a candidate sets, each explicit. `tf32_kept`: the recipe turns
    TF32 on, which under mixed precision is what the matmuls left in 32 bits use."""
    spec = precision_spec(precision)
    return {
        "fp16": spec.flag == "fp16",
        "bf16": spec.flag == "bf16",
        "tf32": spec.tf32_matmuls or (spec.mixed and tf32_kept),
    }


def on_device(kind: str, capability: tuple[int, int] | None) -> tuple[Precision, ...]:
    """The precisions a device trains in as named: the CPU's, or those a GPU of this
    CUDA capability has the units for."""
    if kind == "cpu":
        return tuple(spec.precision for spec in DECLARED if spec.on_cpu)
    have = capability or (0, 0)
    return tuple(
        spec.precision
        for spec in DECLARED
        if spec.cuda_capability is not None and have >= spec.cuda_capability
    )


def from_fields(settings: Mapping[str, Any]) -> Precision:
    """The precision a user's arguments run: the first of their flags set, else fp32."""
    return next((BY_FLAG[flag] for flag in FLAGS if settings.get(flag) is True), Precision.FP32)
