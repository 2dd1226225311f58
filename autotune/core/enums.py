"""The closed sets of names the tool uses; the CLI's choices and the core share them."""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """How a trial ended (one closed set; never guessed from log text)."""

    OK = "ok"
    OOM = "oom"
    UNSTABLE = "unstable"
    TIMEOUT = "timeout"
    ERROR = "error"
    SKIPPED = "skipped"


class Task(enum.StrEnum):
    SEQ2SEQ = "seq2seq"
    CAUSAL_LM = "causal-lm"
    MASKED_LM = "masked-lm"
    CLASSIFICATION = "classification"


class DeviceKind(enum.StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


class Precision(enum.StrEnum):
    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    # No autocast, on a job that holds weights in 16 bits or quantized (a bf16 checkpoint,
    # a 4-bit base, adapters TRL cast to bf16): each layer computes in the dtype its
    # weights are held in, which is not fp32, so it is not called fp32
    AS_LOADED = "as-loaded"


class Objective(enum.StrEnum):
    THROUGHPUT = "throughput"  # the fastest config that fits
    EFFICIENCY = "efficiency"  # samples/s per GiB of peak memory


class SamplerName(enum.StrEnum):
    MODEL = "model"  # tuning/_propose.py: an additive model of step time proposes
    TPE = "tpe"
    RANDOM = "random"
    NSGA2 = "nsga2"


def values(kind: type[enum.StrEnum]) -> list[str]:
    """The members' values, in order (click.Choice takes these)."""
    return [member.value for member in kind]
