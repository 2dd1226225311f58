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
