"""Analytic memory estimates, before anything runs, and refined by what has run.

Pure arithmetic (bytes per parameter, activation bytes from the architecture), apart
from the I/O (counting parameters on the meta device, which allocates nothing); the fit
of the activation term to the peaks a study has measured is in _memory_verdict.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from autotune.core.checkpointing import Checkpointing
from autotune.core.enums import DeviceKind, Task
from autotune.core.errors import UsageError
from autotune.core.job import ParameterCount
from autotune.core.levers import DEEPSPEED, shards
from autotune.core.optimizers import MEASURED, optimizer
from autotune.core.precisions import precision_spec
from autotune.core.space import SearchSpace
from autotune.core.trial import Candidate, ModelSpec
from autotune.core.units import format_size

# The published rule (Hugging Face's single-GPU training guide): fp32 weights 4 bytes a
# parameter, mixed precision 6 (fp32 master + 16-bit copy); gradients 4; optimizer state
# 8 for AdamW, 2 for 8-bit Adam. Each precision's and optimizer's figures are its
# declaration's (core/precisions.py, core/optimizers.py).
GRADIENT_BYTES = 4
PROCESS_BYTES = {"cpu": 350 * 2**20, "cuda": 600 * 2**20}  # interpreter + libraries / context
FAR_OVER = 1.5  # skip only what the estimate puts this far over the budget


def step_bytes(parameters: int, largest: int, optim: str, device_kind: str) -> int:
    """Temporaries of the optimizer step: alive with the weights, gradients and state,
    after backward has freed the activations (each optimizer's, core/optimizers.py).
    Fused AdamW and bitsandbytes' kernels update in place."""
    return optimizer(optim).step_temporaries(parameters, largest, device_kind)


def embedding_grad_bytes(config: dict[str, Any], task: str, largest: int, accumulation: int) -> int:
    """Backward's last moment, once the activations are freed: the input embedding's dense
    gradients (4 bytes each; `largest` stands for the embedding). A weight used twice, an
    encoder-decoder's shared embedding or one tied to the output layer, gets a gradient
    from each use and their sum: three copies alive, one of which stays as the gradient
    unless the step accumulates into an earlier one. Used once, its gradient is a
    temporary only when added to an accumulated one. An H100 measured mT5-small (one
    0.48 GiB embedding, shared; the output layer tied to it as transformers 5.23 builds
    it): 2 copies above the gradients at 16x1, 3 at 8x2 to 1x16, whatever the batch."""
    shared = bool(config.get("is_encoder_decoder", task == Task.SEQ2SEQ))  # BART-cls too
    tied = bool(config.get("tie_word_embeddings", True)) and task != Task.CLASSIFICATION
    uses = 1 + shared + tied
    copies = 3 if uses > 1 else 1
    return 4 * largest * (copies - (accumulation == 1))


@dataclasses.dataclass(frozen=True)
class Breakdown:
    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    step: int = 0  # the optimizer step's temporaries (step_bytes), after activations free
    embedding_grads: int = 0  # backward's end (embedding_grad_bytes), activations freed

    @property
    def static(self) -> int:
        return self.weights + self.gradients + self.optimizer_state

    @property
    def after_activations(self) -> int:
        """The larger moment once the activations are freed: backward's end or the step."""
        return max(self.step, self.embedding_grads)

    @property
    def total(self) -> int:
        return self.static + max(self.activations, self.after_activations)


def state_bytes(optim: str) -> int:
    return optimizer(optim).state()


def optimizer_state(parameters: int, optim: str, embedding: int = 0) -> int:
    """The optimizer's state in bytes; `embedding` of the parameters in nn.Embedding."""
    declared = optimizer(optim)
    if declared.embedding_state_bytes is not None:
        return (parameters - embedding) * declared.state() + (
            embedding * declared.embedding_state_bytes
        )
    return parameters * declared.state()


def static_bytes(
    parameters: int,
    precision: str,
    optim: str,
    split: tuple[int, int, int] = (1, 1, 1),
    embedding: int = 0,
    trainable: int = 0,
    frozen_bytes: int = 0,
) -> int:
    """Weights + gradients + optimizer state: what any batch size needs, per process when
    ZeRO splits them `split` ways (weights, gradients, optimizer state). Gradients and
    state are the `trainable` parameters' (0: all of them)."""
    w, g, o = split
    t, e = trained(parameters, trainable, embedding)
    return (
        weight_bytes(parameters, precision, trainable, frozen_bytes) // w
        + t * GRADIENT_BYTES // g
        + optimizer_state(t, optim, e) // o
    )


def weight_bytes(parameters: int, precision: str, trainable: int = 0, frozen_bytes: int = 0) -> int:
    """The weights as the job holds them: the trained ones at the precision's bytes (fp32,
    plus a 16-bit copy under mixed precision), the frozen ones as they were loaded
    (`frozen_bytes`: a bf16 base 2 bytes a parameter, a 4-bit one about half). Without
    `frozen_bytes` every parameter counts at the precision's bytes, as a model built in
    fp32 holds them."""
    t, _ = trained(parameters, trainable, 0)
    if frozen_bytes and t < parameters:
        return t * precision_spec(precision).weight_bytes + frozen_bytes
    return parameters * precision_spec(precision).weight_bytes


def trained(parameters: int, trainable: int, embedding: int) -> tuple[int, int]:
    """(parameters with gradients and optimizer state, of which in embeddings): all, or
    an adapter's `trainable` ones with the embeddings frozen, as LoRA leaves them."""
    if not trainable or trainable >= parameters:
        return parameters, embedding
    return trainable, 0


# TRL's SFTTrainer (1.x) scores tokens through a fused LM head (trl/kernels/
# chunked_logprob.py): the logits are never held whole but folded tile by tile, at most
# 4096 tokens x 32768 vocabulary entries at a time. A tile's entry takes its buffer in
# the compute dtype and, where the fold runs in torch for want of Triton (the CPU), fp32
# temporaries besides: the backward holds the tile's logits, scaled logits, log-probs,
# probabilities and gradient, a bool mask and terms of the gradient at once. Measured on
# the CPU (peak RSS of its forward and backward, 512 to 2048 tokens, fp32 and bf16): 39
# to 49 bytes an entry
FUSED_TILE_TOKENS = 4096
FUSED_TILE_VOCAB = 32768
FUSED_TORCH_BYTES = 38


def logit_bytes(
    tokens: int, vocab: int, candidate: Candidate, device_kind: str, fused_head: bool
) -> int:
    """What scoring a micro-batch's `tokens` against the vocabulary holds at its peak:
    the logits and their gradient in fp32 (the Trainer's head), or one tile of a fused
    head (`fused_head`: TRL's SFTTrainer)."""
    if not fused_head:
        return 12 * tokens * vocab
    tile = min(tokens, FUSED_TILE_TOKENS) * min(vocab, FUSED_TILE_VOCAB)
    buffer = 2 * precision_spec(candidate.precision).activation_scale  # 16-bit or fp32
    return tile * (buffer + (0 if device_kind == DeviceKind.CUDA else FUSED_TORCH_BYTES))


def activation_bytes(
    config: dict[str, Any],
    task: str,
    candidate: Candidate,
    seq_len: int,
    target_len: int,
    device_kind: str = "cpu",
    fused_head: bool = False,
    held_narrow: bool = False,
) -> int:
    """Activations of one micro-batch (Korthikanti et al. 2022, per layer, 16-bit:
    s*b*h*(34 + 5*a*s/h)), doubled in fp32; on the CPU autocast over a model built in
    fp32 saves less than half (core/precisions.py), while a job `held_narrow`, in 16
    bits or fewer (a bf16 checkpoint, a 4-bit base), keeps the 16-bit figure its peaks
    matched (benchmarks/jobs.py); a checkpointed layer keeps only its input
    (in host memory when offloaded), plus one layer recomputed at a time
    (core/checkpointing.py grades which layers). The scoring of the tokens against the
    vocabulary on top (`logit_bytes`)."""
    h = _first(config, "hidden_size", "d_model", "n_embd", default=768)
    layers = _first(config, "num_hidden_layers", "num_layers", "n_layer", default=12)
    heads = _first(config, "num_attention_heads", "num_heads", "n_head", default=12)
    vocab = _first(config, "vocab_size", default=32000)
    b = candidate.per_device_train_batch_size
    declared = precision_spec(candidate.precision)
    scale = declared.activation_scale if held_narrow else declared.saved_scale(device_kind)

    def layer(s: int, attended: int) -> int:
        return int(s * b * h * (34 + 5 * heads * attended // h) * scale)

    stacks = [(0, layers, layer(seq_len, seq_len), seq_len)]
    out_len = seq_len
    if task == Task.SEQ2SEQ:
        decoder_layers = _first(config, "num_decoder_layers", default=layers)
        stacks.append((layers, decoder_layers, layer(target_len, target_len + seq_len), target_len))
        out_len = target_len
    level = candidate.activation_checkpointing
    # offloaded, the checkpointed layers' inputs are held in host memory, not the device's
    saved = 0 if level == Checkpointing.OFFLOAD and device_kind == DeviceKind.CUDA else 1
    total = recomputed = 0
    for first, count, per_layer, s in stacks:
        kept = level.kept_layers(first, count)
        total += kept * per_layer + int((count - kept) * 2 * s * b * h * scale * saved)
        if kept < count:  # the layer being recomputed
            recomputed = max(recomputed, per_layer)
    # one at a time, never two stacks' together: an encoder's layers recompute once the
    # decoder's backward is done
    total += recomputed
    if task == Task.CLASSIFICATION:
        return total
    return total + logit_bytes(b * out_len, vocab, candidate, device_kind, fused_head)


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
    trainable: int = 0,
    frozen_bytes: int = 0,
    fused_head: bool = False,
    held_narrow: bool = False,
) -> Breakdown:
    w, g, o = shards(candidate.levers.shard_stage, nproc_per_node)  # per process, sharded
    t, e = trained(parameters, trainable, embedding)
    largest = min(largest, t)  # an adapter's tensors are small
    zero = candidate.levers.shard_stage and candidate.levers.engine == DEEPSPEED
    # under ZeRO DeepSpeed's own optimizer steps the shards; under FSDP the Trainer's
    # steps each process's shards
    step = 0 if zero else step_bytes(t, largest, candidate.optim, device_kind) // o
    # ZeRO accumulates in its own (sharded, maybe 16-bit) buffers; a frozen embedding
    # (an adapter's base) has no gradient
    frozen = zero or t < parameters
    # offloaded (FSDP's CPU offload): the gradients and the state wait in host memory,
    # the device holds the weights of the layers at work (a share of them, at most)
    kept = 0 if candidate.levers.offloads else 1
    return Breakdown(
        weights=weight_bytes(parameters, candidate.precision, trainable, frozen_bytes) // w,
        gradients=kept * t * GRADIENT_BYTES // g,
        optimizer_state=kept * optimizer_state(t, candidate.optim, e) // o,
        activations=activation_bytes(
            config, task, candidate, seq_len, target_len, device_kind, fused_head, held_narrow
        ),
        step=step,
        embedding_grads=0
        if frozen
        else embedding_grad_bytes(config, task, largest, candidate.gradient_accumulation_steps),
    )


def floor_bytes(
    parameters: int,
    candidate: Candidate,
    nproc_per_node: int = 1,
    embedding: int = 0,
    trainable: int = 0,
    frozen_bytes: int = 0,
) -> int:
    """Bytes the weights, gradients and optimizer state certainly take per process: the
    frozen weights as held (`frozen_bytes`), the trained ones in 32 bits (16 under
    DeepSpeed's 16-bit engine)."""
    w, g, o = shards(candidate.levers.shard_stage, nproc_per_node)
    sixteen = candidate.levers.engine == DEEPSPEED and precision_spec(candidate.precision).mixed
    tensor = 2 if candidate.levers.shard_stage and sixteen else 4
    declared = optimizer(candidate.optim)
    t, e = trained(parameters, trainable, embedding)
    if declared.floor_bytes and declared.embedding_state_bytes is not None:
        state = optimizer_state(t, declared.name, e)
    else:
        state = t * declared.floor_bytes
    held = t * tensor + frozen_bytes if frozen_bytes and t < parameters else parameters * tensor
    if candidate.levers.offloads:  # the shards wait in host memory: none certainly on the device
        return 0
    return held // w + t * tensor // g + state // o


def check_budget(
    parameters: int,
    precisions: Sequence[str],
    optimizers: Sequence[str],
    budget_bytes: int,
    *,
    split: tuple[int, int, int] = (1, 1, 1),
    embedding: int = 0,
    trainable: int = 0,
    frozen_bytes: int = 0,
) -> None:
    """Refuse a budget that no config can meet, saying what would fit instead (`split`:
    the most ZeRO splits weights, gradients and optimizer state across processes); the
    frozen weights count as they are held (`frozen_bytes`)."""
    held = (trainable, frozen_bytes)
    millions = f"{parameters / 1e6:.0f}M parameters"
    weights = weight_bytes(parameters, "fp32", *held) // split[0]
    what = "weights as your job holds them" if frozen_bytes else "fp32 weights"
    cheapest = min(MEASURED, key=state_bytes)
    if budget_bytes < weights:
        least = static_bytes(parameters, "fp32", cheapest, split, embedding, *held)
        raise UsageError(
            f"--memory-budget {format_size(budget_bytes)} is below the {format_size(weights)} "
            f"the {what} alone need ({millions}); training needs at least "
            f"{format_size(least)} with {cheapest} "
            "(weights, gradients, optimizer state) plus activations"
        )
    need = min(
        static_bytes(parameters, p, o, split, embedding, *held)
        for p in precisions
        for o in optimizers
    )
    if need >= budget_bytes:
        fitting = [
            o
            for o in MEASURED
            if static_bytes(parameters, "fp32", o, split, embedding, *held) < budget_bytes
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
    trainable: int = 0  # those that train where not all do (an adapter's); 0: all


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
            for ckpt in space.checkpointing:
                candidate = space.candidate(batch, precision, ckpt, optim)
                b = breakdown(
                    counted.total,
                    model.config,
                    model.task,
                    candidate,
                    seq_len,
                    target_len,
                    embedding=counted.embedding,
                    largest=counted.largest,
                    device_kind=device_kind,
                    trainable=counted.trainable,
                    frozen_bytes=counted.frozen_bytes,
                )
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
        counted.trainable,
    )
