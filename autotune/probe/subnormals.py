"""Subnormal numbers on the CPU: what this CPU pays for them (`slowdown`, which
`autotune doctor` reports) and how many a job makes (`share`, which a CPU probe reads
from the optimizer's state after its steps). The rules on them are in core/subnormals.py.

Training makes them where values underflow: a random-weight mt5-small (an LM head of
std 1, logits of std 24) left 4% of its softmax over 250k tokens subnormal at its first
step and 22% at its 20th, and 47 million of its Adam state's entries. On the 2-core
Intel Xeon its fp32 steps took 6.5-9.3 s at first and 12.5-14.5 s by then (four runs),
and 3-4.3 s under `torch.set_flush_denormal`, which flushes them to zero, with the same
losses (benchmarks/subnormals.py). NVIDIA GPUs add and multiply them at full speed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from typing import Any

from autotune.core.subnormals import SHARE

# Deferred imports: torch loads in the probe or in doctor; the search imports this module's
# callers without it

# N(0, 1) times this lies below float32's smallest normal number (1.18e-38): subnormal
SCALE = 1e-39
# Numbers read of each tensor, drawn at random (a smaller tensor is read whole): a share
# estimated in milliseconds, not a pass over every weight's state (mt5-small's: 344
# million numbers)
SAMPLE = 65_536


def slowdown(seconds: float = 0.5, size: int = 256) -> tuple[float, float, float]:
    """How many times longer this CPU takes for an fp32 matmul whose inputs are
    subnormal than for the same matmul at a normal scale: the median, lowest and highest
    of interleaved pairs, at least three and more while `seconds` last, each side timed
    over about 10 ms of its own calls. Its inputs come from a generator of its own: a
    probe's later steps draw the same numbers whether this ran or not."""
    import torch

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(size, size, generator=generator)
    normal = torch.randn(size, size, generator=generator)
    subnormal = normal * SCALE

    def per_call(x: Any, runs: int) -> float:
        started = time.perf_counter()
        for _ in range(runs):
            torch.nn.functional.linear(x, weight)
        return (time.perf_counter() - started) / runs

    with torch.no_grad():
        per_call(normal, 3)  # warm-up: the kernel, the caches
        normal_runs, subnormal_runs = (
            max(1, int(0.01 / max(per_call(x, 3), 1e-9))) for x in (normal, subnormal)
        )
        ratios: list[float] = []
        deadline = time.perf_counter() + seconds
        while len(ratios) < 3 or time.perf_counter() < deadline:
            slow = per_call(subnormal, subnormal_runs)
            ratios.append(slow / per_call(normal, normal_runs))
    return statistics.median(ratios), min(ratios), max(ratios)


def share(tensors: Iterable[Any]) -> float | None:
    """The share of the numbers in `tensors` that are subnormal: of those in fp32, bf16
    or fp64 (a CPU computes fp16 in fp32, where its subnormals are normal), each tensor
    read at SAMPLE numbers drawn at random and weighted by its size. Zeros are numbers
    like any other. Nothing is copied whole: a tensor that is no permutation of a dense
    one is passed over. None: no tensor read."""
    import torch

    paying = {torch.float32, torch.bfloat16, torch.float64}
    generator = torch.Generator().manual_seed(0)
    counted = total = 0.0
    for tensor in tensors:
        if not torch.is_tensor(tensor) or tensor.dtype not in paying or tensor.numel() < 2:
            continue  # Adam's step counter: one number
        flat = _flat(tensor.detach())
        if flat is None:
            continue
        if flat.numel() > SAMPLE:
            flat = flat[torch.randint(flat.numel(), (SAMPLE,), generator=generator)]
        size = flat.abs()
        hits = int(((size > 0) & (size < torch.finfo(tensor.dtype).tiny)).sum())
        counted += hits / flat.numel() * tensor.numel()
        total += tensor.numel()
    return counted / total if total else None


def _flat(tensor: Any) -> Any:
    """`tensor`'s numbers as one dimension without a copy (AdamW's state of a transposed
    weight has the weight's strides, and `reshape` would copy it whole, under the probe's
    memory limit); None where no order of its dimensions is dense."""
    order = sorted(range(tensor.dim()), key=tensor.stride, reverse=True)
    dense = tensor.permute(order)
    return dense.view(-1) if dense.is_contiguous() else None


def in_optimizer(
    trainer: Any, timed: bool = True, seconds: float = 0.2
) -> tuple[float | None, float | None]:
    """After training: the share of the trainer's optimizer state that is subnormal, and
    where it reaches SHARE and `timed` (one process of a run times the CPU, not each at
    once), what this CPU pays for them (`slowdown`'s median over `seconds`); None for
    what was not measured (an optimizer without state)."""
    optimizer = getattr(trainer, "optimizer", None)
    state = getattr(optimizer, "state", None) or {}
    found = share(value for entry in state.values() for value in _values(entry))
    if found is None or found < SHARE or not timed:
        return found, None
    return found, slowdown(seconds)[0]


def _values(entry: Any) -> list[Any]:
    return list(entry.values()) if isinstance(entry, dict) else []
