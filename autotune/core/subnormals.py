"""Subnormal numbers: values below a float's smallest normal (about 1.2e-38 in fp32 and
bf16). x86 cores without flush-to-zero take a microcode assist for each operation on
one, and what that costs differs by core: nothing to speak of on some, a matmul 100x
slower or more on others. The probe counts them and times the CPU
(probe/subnormals.py); these rules say when that is worth the user's knowing (doctor,
and the export's lines for their script)."""

from __future__ import annotations

SLOW = 1.5  # a matmul on subnormal inputs this many times slower: the CPU pays for them
# This share of the optimizer's state subnormal after a probe's steps: the job makes
# them (a random-weight mt5-small's: 13.8% after its first step, 6.3% after its 20th,
# benchmarks/subnormals.json; a job that makes none: 0)
SHARE = 0.01


def worth_flushing(share: float | None, slowdown: float | None) -> bool:
    """Whether a run whose optimizer state held `share` subnormal numbers, on a CPU that
    multiplies them `slowdown` times slower, should flush them to zero
    (`torch.set_flush_denormal(True)`); unmeasured (None) is no."""
    if share is None or slowdown is None:
        return False
    return share >= SHARE and slowdown >= SLOW
