"""Model FLOPs and the device's measured peak, so a trial's throughput has a scale.

Training FLOPs are 3 x the forward's matrix-multiply FLOPs (forward 1, backward 2: the
gradients with respect to the input and to the weight; a frozen weight, as under a LoRA
adapter, has no gradient of its own: 2 x for it). Attention's matmuls have no weight:
their backward takes the gradients with respect to both inputs, 3 x whatever trains.
The forward counts:

* 2 x every matmul weight (`nn.Linear`, GPT-2's `Conv1D`, and the LM head even when it
  is tied to the input embeddings) x the tokens that weight runs on. Embedding lookups
  (token, position, token-type, T5's relative bias) are not matmuls and count nothing;
  norms, biases and activations are left out as small.
* 4 x layers x heads x head_dim x query length x key length per attention (QK^T and
  AV), counting the whole square even when a causal mask throws half of it away, as
  the eager kernels and `FlopCounterMode` do.

Which tokens a weight runs on depends on the task:

* causal LM, masked LM: every weight, the LM head included, on every token.
* classification: the body on every token; the head (the modules outside
  `model.base_model`, and a BERT-style pooler) on the one token it pools.
* seq2seq: `model.get_encoder()` on the source tokens; `model.get_decoder()` on the
  target tokens, except its cross-attention key/value projections, which run on the
  encoder's output (source tokens); the LM head on the target tokens. Attention: the
  encoder's over source x source, the decoder's self-attention over target x target
  and its cross-attention over target x source.

These are model FLOPs: recomputation under gradient checkpointing is not counted, so
the figure is model FLOP utilisation (MFU), not hardware FLOPs.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from autotune.core.enums import DeviceKind, Task
from autotune.core.precisions import PrecisionSpec, precision_spec
from autotune.probe.device import synchronize

# Deferred imports: torch and transformers load in the probe or in doctor; the search imports
# this module (through the fork server) without them

# A cross-attention block, by the names transformers gives it (T5's `EncDecAttention`,
# the BART family's `encoder_attn`, BERT-as-decoder's `crossattention`, `cross_attn`),
# and its key/value projections, which run on the encoder's output.
_CROSS_ATTENTION = ("encdecattention", "encoder_attn", "crossattention", "cross_attn")
_KEY_VALUE = frozenset({"k", "v", "key", "value", "k_proj", "v_proj", "kv", "kv_proj"})


def flops_per_sample(model: Any, task: str, seq_len: int, target_len: int) -> float:
    """Training FLOPs (forward + backward) of one sample at the probe's lengths.

    The backward's gradient with respect to the weights is counted for the share of
    parameters that train: a frozen base under a LoRA adapter computes only the
    gradient with respect to the input (2 forwards' worth, not 3). Attention's backward
    is 2 forwards' worth whatever trains."""
    if task == Task.SEQ2SEQ:
        weights, attention = _seq2seq_forward(model, seq_len, target_len)
    else:
        weights, attention = _single_stack_forward(model, task, seq_len)
    return float((2 + _training_share(model)) * weights + 3 * attention)


def _training_share(model: Any) -> float:
    sizes = [(p.numel(), p.requires_grad) for p in model.parameters()]
    total = sum(n for n, _ in sizes)
    return sum(n for n, trains in sizes if trains) / total if total else 1.0


# ---- the forward's FLOPs ----------------------------------------------------------------


def _single_stack_forward(model: Any, task: str, seq_len: int) -> tuple[int, int]:
    """The forward's FLOPs: its weights' matmuls, and attention's."""
    weights = _model_weights(model)
    pooled = _head_weights(model, weights) if task == Task.CLASSIFICATION else {}
    body = sum(n for name, n in weights.items() if name not in pooled)
    matmuls = 2 * body * seq_len + 2 * sum(pooled.values())
    return matmuls, _attention(model.config, seq_len, seq_len)


def _seq2seq_forward(model: Any, source_len: int, target_len: int) -> tuple[int, int]:
    """The forward's FLOPs: its weights' matmuls, and attention's."""
    weights = _model_weights(model)
    encoder = _matmul_weights(model.get_encoder())
    decoder = _matmul_weights(model.get_decoder())
    cross_kv = sum(n for name, n in decoder.items() if _is_cross_key_value(name))
    head = sum(weights.values()) - sum(encoder.values()) - sum(decoder.values())
    on_source = sum(encoder.values()) + cross_kv
    on_target = sum(decoder.values()) - cross_kv + head
    encoder_config = model.get_encoder().config
    decoder_config = model.get_decoder().config
    attention = (
        _attention(encoder_config, source_len, source_len, "encoder")
        + _attention(decoder_config, target_len, target_len, "decoder")
        + _attention(decoder_config, target_len, source_len, "decoder")
    )
    return 2 * on_source * source_len + 2 * on_target * target_len, attention


def _attention(config: Any, query_len: int, key_len: int, side: str = "") -> int:
    """QK^T and AV of every layer: 2 matmuls of 2 x query x key x heads x head_dim.

    `side` ("encoder" or "decoder") prefers that stack's names (BART's `decoder_layers`).
    """
    sided_layers = (f"{side}_layers", f"num_{side}_layers") if side else ()
    layers = _first(config, *sided_layers, "num_hidden_layers", "num_layers", "n_layer")
    sided_heads = (f"{side}_attention_heads",) if side else ()
    heads = _first(config, *sided_heads, "num_attention_heads", "num_heads", "n_head")
    hidden = _first(config, "hidden_size", "d_model", "n_embd")
    head_dim = _first(config, "head_dim", "d_kv") or (hidden // heads if heads else 0)
    return 4 * layers * heads * head_dim * query_len * key_len


# ---- which weights multiply --------------------------------------------------------------


def _matmul_weights(module: Any) -> dict[str, int]:
    """Elements of each matmul weight (`nn.Linear`, `Conv1D`), by module name."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    return {
        name: sub.weight.numel()
        for name, sub in module.named_modules()
        if isinstance(sub, (nn.Linear, Conv1D))
    }


def _model_weights(model: Any) -> dict[str, int]:
    """The model's matmul weights, and its output embeddings when they are not a Linear.

    A tied LM head is usually a Linear sharing the embedding's weight, so it is counted
    above; a model that takes its logits from the embedding table itself is counted here.
    """
    weights = _matmul_weights(model)
    output = model.get_output_embeddings()
    counted = {id(sub.weight) for name, sub in model.named_modules() if name in weights}
    if output is not None and id(output.weight) not in counted:
        weights["<output embeddings>"] = output.weight.numel()
    return weights


def _head_weights(model: Any, weights: dict[str, int]) -> dict[str, int]:
    """A classifier's weights that run on the pooled token only."""
    base = getattr(model, "base_model", model)
    prefix = "" if base is model else getattr(model, "base_model_prefix", "") + "."
    return {
        name: n
        for name, n in weights.items()
        if (prefix and not name.startswith(prefix)) or "pooler" in name.split(".")
    }


def _is_cross_key_value(name: str) -> bool:
    parts = name.lower().split(".")
    return parts[-1] in _KEY_VALUE and any(p in _CROSS_ATTENTION for p in parts[:-1])


def _first(config: Any, *names: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def measure_peak_flops(device_kind: str, precision: str, seconds: float = 0.3) -> float:
    """FLOP/s of a linear layer's matrix multiply at this precision on this device. On
    the CPU, run the way training runs it: fp32 weights and inputs, under autocast for
    fp16 and bf16 (the Trainer's mixed precision), so the peak uses the kernel training
    uses (a plain fp16 matmul on a CPU took a slow path: 4.1 GFLOP/s where fp16 training
    ran 70, an MFU of 1726%); the best of a few sizes, where the kernel and its speed
    change with the size (an AMD EPYC without bf16 units: 3.0 GFLOP/s in bf16 at 128,
    0.9 at 1024, where a tiny model trained at 2.2).

    On CUDA, where an MFU is read against the chip's peak, the product the peak means
    (`_cuda_peak`): not autocast's casts of fp32 inputs nor a sync after each product.

    TF32 is set through torch's `fp32_precision` API only: transformers 5 sets that API,
    and torch refuses a read of the legacy `allow_tf32` flag once it has been set.
    """

    import torch

    declared = precision_spec(precision)  # the Trainer's mixed precision, or TF32 matmuls
    if device_kind == DeviceKind.CUDA:
        return _cuda_peak(declared, seconds)
    sizes, device = (128, 512), "cpu"
    mixed = (
        torch.autocast(device, dtype=getattr(torch, declared.autocast))
        if declared.mixed
        else contextlib.nullcontext()
    )
    matmul = torch.backends.cuda.matmul
    previous = matmul.fp32_precision
    matmul.fp32_precision = "tf32" if declared.tf32_matmuls else "ieee"
    best = 0.0
    try:
        with torch.no_grad(), mixed:
            for size in sizes:
                x = torch.randn(size, size, device=device)
                weight = torch.randn(size, size, device=device)
                best = max(best, _linear_flops(x, weight, seconds / len(sizes), device_kind))
    finally:
        matmul.fp32_precision = previous
    return best


def _cuda_peak(declared: PrecisionSpec, seconds: float, size: int = 8192) -> float:
    """FLOP/s of a `size`-square product on the GPU in the precision's own dtype (16 bits
    for mixed precision; fp32 with TF32 or not), the queue synchronised only at each
    batch of five: the convention MFU's peak follows, and what benchmarks/mfu.py measures
    (790 TFLOP/s in bf16 on an H200). The autocast product of fp32 inputs at 4096, synced
    after each, also timed the casts and the syncs: by their bytes and launches about a
    quarter of the time, so show's MFU read high (an estimate; not timed side by side)."""
    import torch

    dtype = getattr(torch, declared.autocast) if declared.mixed else torch.float32
    matmul = torch.backends.cuda.matmul
    previous = matmul.fp32_precision
    matmul.fp32_precision = "tf32" if declared.tf32_matmuls else "ieee"
    try:
        with torch.no_grad():
            x, weight = (torch.randn(size, size, device="cuda", dtype=dtype) for _ in range(2))
            for _ in range(3):  # warm-up: the kernel's choice, the clocks
                torch.nn.functional.linear(x, weight)
            torch.cuda.synchronize()
            runs, started = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - started) < seconds or not runs:
                for _ in range(5):
                    torch.nn.functional.linear(x, weight)
                runs += 5
                torch.cuda.synchronize()
            return float(2.0 * size**3 * runs / elapsed)
    finally:
        matmul.fp32_precision = previous


def _linear_flops(x: Any, weight: Any, seconds: float, device_kind: str) -> float:
    """FLOP/s of `linear(x, weight)` repeated for about `seconds`, after a warm-up."""
    import torch

    torch.nn.functional.linear(x, weight)  # warm-up: kernels, caches, autocast's casts
    synchronize(device_kind)
    runs, started = 0, time.perf_counter()
    while True:
        torch.nn.functional.linear(x, weight)
        runs += 1
        synchronize(device_kind)
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return float(2.0 * x.shape[0] * x.shape[1] * weight.shape[0] * runs / elapsed)
