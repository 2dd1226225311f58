"""Model FLOPs and the device's measured peak, so a trial's throughput has a scale.

Model FLOPs per token follow the usual rule: 6 x the parameters that take part in
matrix multiplies (forward 2, backward 4), plus 12 x layers x hidden x attended length
for attention. Recomputation under checkpointing is not counted: this is model FLOP
utilisation (MFU), not hardware FLOPs.
"""

from __future__ import annotations

import time
from typing import Any

_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def flops_per_sample(model: Any, task: str, seq_len: int, target_len: int) -> float:
    """Training FLOPs (forward + backward) of one sample at the probe's lengths."""
    config = model.config
    parameters = sum(p.numel() for p in model.parameters())
    embeddings = model.get_input_embeddings()
    output = model.get_output_embeddings()
    tied = embeddings is not None and output is not None and output.weight is embeddings.weight
    if embeddings is not None and not tied:
        parameters -= embeddings.weight.numel()  # a lookup, not a matrix multiply
    hidden = _first(config, "hidden_size", "d_model", "n_embd")
    layers = _first(config, "num_hidden_layers", "num_layers", "n_layer")
    tokens = seq_len + (target_len if task == "seq2seq" else 0)
    attention = 12 * layers * hidden * seq_len * seq_len
    if task == "seq2seq":
        decoder = _first(config, "num_decoder_layers") or layers
        attention += 12 * decoder * hidden * target_len * (target_len + seq_len)
    return float(6 * parameters * tokens + attention)


def measure_peak_flops(device_kind: str, precision: str, seconds: float = 0.3) -> float:
    """FLOP/s of a square matrix multiply at this precision on this device."""
    import torch

    from autotune.probe import device as hardware

    size = 4096 if device_kind == "cuda" else 1024
    dtype = getattr(torch, _DTYPES[precision])
    device = "cuda" if device_kind == "cuda" else "cpu"
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        torch.matmul(a, b)  # warm-up: kernels, caches
        hardware.synchronize(device_kind)
        runs, started = 0, time.perf_counter()
        while True:
            torch.matmul(a, b)
            runs += 1
            hardware.synchronize(device_kind)
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                break
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2.0 * size**3 * runs / elapsed


def _first(config: Any, *names: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return 0
