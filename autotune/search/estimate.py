"""Analytic memory estimates, before anything runs, and refined by what has run.

Three parts kept apart: pure arithmetic (bytes per parameter, activation bytes from the
architecture), the I/O (counting parameters on the meta device, which allocates
nothing), and the fit of the activation term to the peaks a study has measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from autotune.core.enums import Outcome, Task
from autotune.core.errors import UsageError
from autotune.core.space import SearchSpace
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, ModelSpec, TrialRecord, TrialResult
from autotune.core.units import format_size
from autotune.hf.models import ParameterCount
from autotune.hf.sharding import shards

# The published rule (Hugging Face's single-GPU training guide): fp32 weights 4 bytes a
# parameter, mixed precision 6 (fp32 master + 16-bit copy); gradients 4; optimizer state
# 8 for AdamW, 2 for 8-bit Adam, about 4 for Adafactor.
WEIGHT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 6, "bf16": 6}
GRADIENT_BYTES = 4
OPTIMIZER_STATE_BYTES = {
    "adamw_torch": 8,
    "adamw_torch_fused": 8,
    "adamw_bnb_8bit": 2,
    "adamw_8bit": 2,
    "paged_adamw_8bit": 2,
    "adamw_torch_8bit": 2,
    "adamw_torch_4bit": 1,
    "adafactor": 4,
    "sgd": 0,
    "adagrad": 4,
    "rmsprop": 4,
    "lion_8bit": 1,
    "lion_32bit": 4,
}
DEFAULT_STATE_BYTES = 8
# Under bitsandbytes' 8-bit optimizers the Trainer keeps 32-bit state for nn.Embedding
# weights (transformers' create_optimizer registers optim_bits=32 for each): their bytes
# a parameter. On mT5, embeddings are 128M of 172M parameters, and 8-bit Adam ran out of
# memory where Adafactor fitted, on the CPU and on an H100.
EMBEDDING_STATE_BYTES = {"adamw_bnb_8bit": 8, "adamw_8bit": 8, "paged_adamw_8bit": 8,
                         "lion_8bit": 4}  # fmt: skip
# What a config certainly holds at its first optimizer step, per parameter: a floor the
# search skips on with no margin (the rule above plans; this one must never overstate).
# The Trainer keeps fp32 weights under autocast, gradients take their dtype; Adafactor's
# factored state, paged state (which may sit in host memory) and unknown optimizers
# count 0. DeepSpeed's 16-bit engine keeps 16-bit weights and gradients.
FLOOR_STATE_BYTES = {
    "adamw_torch": 8,
    "adamw_torch_fused": 8,
    "adamw_bnb_8bit": 2,
    "adamw_8bit": 2,
    "adamw_torch_8bit": 2,
    "adamw_torch_4bit": 1,
    "lion_8bit": 1,
    "lion_32bit": 4,
}
PROCESS_BYTES = {"cpu": 350 * 2**20, "cuda": 600 * 2**20}  # interpreter + libraries / context
FAR_OVER = 1.5  # skip only what the estimate puts this far over the budget


def step_bytes(parameters: int, largest: int, optim: str, device_kind: str) -> int:
    """Temporaries of the optimizer step: alive with the weights, gradients and state,
    after backward has freed the activations (read in torch 2.13 and transformers 5.23).

    torch's AdamW on CUDA steps each parameter group in one foreach pass whose square
    root of the second moment is a copy of all of it (4 bytes a parameter); on the CPU it
    steps a tensor at a time, sqrt then a division: two copies of the largest. The
    Trainer's Adafactor steps a tensor at a time too (grad**2 + eps, then the factored
    estimate): two copies of the largest, 1 GiB on mT5-small's shared embedding, which an
    H100 probe's 3.72 GiB peak under a 4 GiB budget showed. Fused AdamW and bitsandbytes'
    kernels update in place."""
    if optim == "adamw_torch":
        return 4 * parameters if device_kind == "cuda" else 2 * 4 * largest
    if optim == "adafactor":
        return 2 * 4 * largest
    return 0


@dataclasses.dataclass(frozen=True)
class Breakdown:
    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    step: int = 0  # the optimizer step's temporaries (step_bytes), after activations free

    @property
    def static(self) -> int:
        return self.weights + self.gradients + self.optimizer_state

    @property
    def total(self) -> int:
        return self.static + max(self.activations, self.step)


def state_bytes(optim: str) -> int:
    return OPTIMIZER_STATE_BYTES.get(optim, DEFAULT_STATE_BYTES)


def optimizer_state(parameters: int, optim: str, embedding: int = 0) -> int:
    """The optimizer's state in bytes; `embedding` of the parameters in nn.Embedding."""
    if optim in EMBEDDING_STATE_BYTES:
        return (parameters - embedding) * state_bytes(optim) + embedding * (
            EMBEDDING_STATE_BYTES[optim]
        )
    return parameters * state_bytes(optim)


def static_bytes(
    parameters: int,
    precision: str,
    optim: str,
    split: tuple[int, int, int] = (1, 1, 1),
    embedding: int = 0,
) -> int:
    """Weights + gradients + optimizer state: what any batch size needs, per process when
    ZeRO splits them `split` ways (weights, gradients, optimizer state)."""
    w, g, o = split
    return (
        parameters * WEIGHT_BYTES[precision] // w
        + parameters * GRADIENT_BYTES // g
        + optimizer_state(parameters, optim, embedding) // o
    )


def activation_bytes(
    config: dict[str, Any], task: str, candidate: Candidate, seq_len: int, target_len: int
) -> int:
    """Activations of one micro-batch (Korthikanti et al. 2022, per layer, 16-bit:
    s*b*h*(34 + 5*a*s/h)), doubled in fp32; with checkpointing only each layer's input
    is kept, plus one layer recomputed. Logits and their gradient in fp32 on top."""
    h = _first(config, "hidden_size", "d_model", "n_embd", default=768)
    layers = _first(config, "num_hidden_layers", "num_layers", "n_layer", default=12)
    heads = _first(config, "num_attention_heads", "num_heads", "n_head", default=12)
    vocab = _first(config, "vocab_size", default=32000)
    b = candidate.per_device_train_batch_size
    scale = 2 if candidate.precision in ("fp32", "tf32") else 1

    def layer(s: int, attended: int) -> int:
        return s * b * h * (34 + 5 * heads * attended // h) * scale

    stacks = [(layers, layer(seq_len, seq_len), seq_len)]
    out_len = seq_len
    if task == Task.SEQ2SEQ:
        decoder_layers = _first(config, "num_decoder_layers", default=layers)
        stacks.append((decoder_layers, layer(target_len, target_len + seq_len), target_len))
        out_len = target_len
    total = 0
    for count, per_layer, s in stacks:
        if candidate.activation_checkpointing:
            total += count * 2 * s * b * h * scale + per_layer
        else:
            total += count * per_layer
    logits = 0 if task == Task.CLASSIFICATION else 12 * b * out_len * vocab
    return total + logits


def breakdown(
    parameters: int,
    config: dict[str, Any],
    task: str,
    candidate: Candidate,
    seq_len: int,
    target_len: int,
    nproc_per_node: int = 1,
    embedding: int = 0,
    largest: int = 0,
    device_kind: str = "cpu",
) -> Breakdown:
    w, g, o = shards(candidate.zero_stage, nproc_per_node)  # per process under ZeRO
    # under ZeRO DeepSpeed's own optimizer steps the shards
    step = 0 if candidate.zero_stage else step_bytes(parameters, largest, candidate.optim,
                                                      device_kind)  # fmt: skip
    return Breakdown(
        weights=parameters * WEIGHT_BYTES[candidate.precision] // w,
        gradients=parameters * GRADIENT_BYTES // g,
        optimizer_state=optimizer_state(parameters, candidate.optim, embedding) // o,
        activations=activation_bytes(config, task, candidate, seq_len, target_len),
        step=step,
    )


def floor_bytes(
    parameters: int, candidate: Candidate, nproc_per_node: int = 1, embedding: int = 0
) -> int:
    """Bytes the weights, gradients and optimizer state certainly take per process."""
    w, g, o = shards(candidate.zero_stage, nproc_per_node)
    tensor = 2 if candidate.zero_stage and candidate.precision in ("fp16", "bf16") else 4
    optim = candidate.optim
    if optim in FLOOR_STATE_BYTES and optim in EMBEDDING_STATE_BYTES:
        state = optimizer_state(parameters, optim, embedding)
    else:
        state = parameters * FLOOR_STATE_BYTES.get(optim, 0)
    return parameters * tensor // w + parameters * tensor // g + state // o


def activation_scale(
    measured: Sequence[tuple[Breakdown, TrialResult]], process_bytes: int
) -> float | None:
    """How far the analytic activations are from this study's measured peaks.

    The smallest ratio over clean runs: the most optimistic fit, so the estimate errs
    towards "might fit" and never talks the search out of a config that would. A peak
    the optimizer step may have set (no more above the static terms than the step's
    temporaries) says nothing of the activations and is left out.
    """
    ratios = [
        (r.peak_memory_bytes - process_bytes - b.static) / b.activations
        for b, r in measured
        if r.outcome == Outcome.OK and r.peak_memory_bytes and b.activations > 0
        and r.peak_memory_bytes - process_bytes - b.static > b.step
    ]  # fmt: skip
    return max(0.0, min(ratios)) if ratios else None


def check_budget(
    parameters: int,
    precisions: Sequence[str],
    optimizers: Sequence[str],
    budget_bytes: int,
    *,
    split: tuple[int, int, int] = (1, 1, 1),
    embedding: int = 0,
) -> None:
    """Refuse a budget that no config can meet, saying what would fit instead (`split`:
    the most ZeRO splits weights, gradients and optimizer state across processes)."""
    millions = f"{parameters / 1e6:.0f}M parameters"
    weights = parameters * WEIGHT_BYTES["fp32"] // split[0]
    cheapest = min(OPTIMIZER_STATE_BYTES, key=state_bytes)
    if budget_bytes < weights:
        raise UsageError(
            f"--memory-budget {format_size(budget_bytes)} is below the {format_size(weights)} "
            f"the fp32 weights alone need ({millions}); training needs at least "
            f"{format_size(static_bytes(parameters, 'fp32', cheapest, split))} with {cheapest} "
            "(weights, gradients, optimizer state) plus activations"
        )
    need = min(
        static_bytes(parameters, p, o, split, embedding) for p in precisions for o in optimizers
    )
    if need >= budget_bytes:
        fitting = [
            o
            for o in OPTIMIZER_STATE_BYTES
            if static_bytes(parameters, "fp32", o, split, embedding) < budget_bytes
        ]
        hint = (
            f"--optimizers {','.join(fitting)} would leave room"
            if fitting
            else ("raise --memory-budget")
        )
        raise UsageError(
            f"--memory-budget {format_size(budget_bytes)} cannot hold the weights, gradients "
            f"and optimizer state of any config searched ({format_size(need)} at least for "
            f"{millions}); {hint}, with --checkpointing on and a smaller --global-batch-size"
        )


def _first(config: dict[str, Any], *keys: str, default: int) -> int:
    for key in keys:
        if isinstance(config.get(key), int):
            return int(config[key])
    return default


def make_predictor(
    spec: SearchSpec, records: Sequence[TrialRecord]
) -> Callable[[Candidate], int | None]:
    """Predicted peak of a candidate from the analytic terms and this study's probes.

    The peak is the larger of two moments: backward, with the activations, and the
    optimizer step, with its temporaries once the activations are freed. Before any
    clean probe the activation term is left out (an optimistic estimate), so only a
    config whose weights, gradients, optimizer state and step alone are far over the
    budget is skipped.
    """
    if not spec.parameters:
        return lambda candidate: None
    process = process_bytes(spec.device.kind, records)

    def terms(candidate: Candidate) -> Breakdown:
        return breakdown(
            spec.parameters,
            spec.model.config,
            spec.model.task,
            candidate,
            spec.seq_len,
            spec.target_len,
            spec.nproc_per_node,
            spec.embedding_parameters,
            spec.largest_parameter,
            spec.device.kind,
        )

    scale = activation_scale([(terms(r.candidate), r.result) for r in records], process)

    def predict(candidate: Candidate) -> int:
        b = terms(candidate)
        return int(process + b.static + max((scale or 0.0) * b.activations, b.step))

    return predict


def process_bytes(device_kind: str, records: Sequence[TrialRecord]) -> int:
    """What a probe process holds before training: the median its probes measured (CUDA:
    the context, 676 MiB on an H100 where the typical figure says 600; CPU: the
    resident set after the imports), else the typical figure."""
    key = "context_bytes" if device_kind == "cuda" else "rss_bytes"
    seen = sorted(
        int(value)
        for r in records
        if isinstance(value := r.result.baseline.get(key), int | float) and value > 0
    )
    return seen[len(seen) // 2] if seen else PROCESS_BYTES.get(device_kind, 0)


@dataclasses.dataclass(frozen=True)
class EstimateRow:
    candidate: Candidate
    breakdown: Breakdown


@dataclasses.dataclass(frozen=True)
class Estimate:
    """`autotune estimate`'s answer: a breakdown per precision/optimizer/checkpointing."""

    model: str
    task: str
    parameters: int
    batch: int
    seq_len: int
    target_len: int
    process_bytes: int
    rows: tuple[EstimateRow, ...]


def estimate_rows(
    model: ModelSpec,
    device_kind: str,
    space: SearchSpace,
    counted: ParameterCount,
    batch: int,
    seq_len: int,
    target_len: int,
) -> Estimate:
    rows = []
    for precision in space.precisions:
        for optim in space.optimizers:
            for ckpt in (False, True):
                candidate = space.candidate(batch, precision, ckpt, optim)
                b = breakdown(counted.total, model.config, model.task, candidate, seq_len,
                              target_len, embedding=counted.embedding,
                              largest=counted.largest, device_kind=device_kind)  # fmt: skip
                rows.append(EstimateRow(candidate, b))
    return Estimate(
        model.name,
        str(model.task),
        counted.total,
        batch,
        seq_len,
        target_len,
        PROCESS_BYTES[device_kind],
        tuple(rows),
    )


Verdictor = Callable[[Candidate], str | None]


def far_over_budget(spec: SearchSpec, recs: list[TrialRecord]) -> Verdictor:
    """The estimate's verdict on a candidate: a reason when it cannot fit, either because
    its weights, gradients and optimizer state alone exceed what a probe may use, or
    because the estimate puts it far over the budget."""
    predict = make_predictor(spec, recs)
    limit = FAR_OVER * spec.memory_budget_bytes

    def over(candidate: Candidate) -> str | None:
        floor = floor_bytes(spec.parameters or 0, candidate, spec.nproc_per_node,
                            spec.embedding_parameters)  # fmt: skip
        if floor > spec.fit_limit_bytes:
            return (
                f"weights, gradients and optimizer state alone take {format_size(floor)}, "
                f"over the {format_size(spec.fit_limit_bytes)} a probe may use"
            )
        peak = predict(candidate)
        if peak is None or peak <= limit:
            return None
        budget = format_size(spec.memory_budget_bytes)
        return f"estimate {format_size(peak)} is far over the {budget} budget"

    return over
