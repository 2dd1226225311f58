"""Where a probe writes its result, and how a DDP probe's ranks' results become one.

Launched by torchrun, each rank writes result.rank<R>.json and a rank that fails exits
non-zero, so torchrun stops the ranks waiting on it in a collective; the parent merges
the ranks' results. Light: the parent imports this without torch.
"""

from __future__ import annotations

from pathlib import Path

from autotune.core.enums import Outcome
from autotune.core.files import write_atomic
from autotune.core.trial import TrialResult

RESULT_NAME = "result.json"


def rank_result_name(rank: int) -> str:
    return f"result.rank{rank}.json"


def merge_ranks(trial_dir: Path, world_size: int) -> None:
    """Write result.json from the ranks' results: a failing rank's result wins (an OOM
    before other failures); otherwise rank 0's figures with the highest rank's peak.
    Writes nothing when no rank wrote a result, or when an ok run lacks a rank."""
    results = []
    for rank in range(world_size):
        path = trial_dir / rank_result_name(rank)
        try:
            results.append(TrialResult.from_json(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    failed = sorted(
        (r for r in results if r.outcome != Outcome.OK), key=lambda r: r.outcome != Outcome.OOM
    )
    if failed:
        merged = failed[0]
    elif results and len(results) == world_size:
        merged = results[0]
    else:
        return
    peaks = [r.peak_memory_bytes for r in results if r.peak_memory_bytes is not None]
    # the limit the ranks ran under: the loosest rank's; None when a rank had none
    limits = [r.memory_limit_bytes for r in results if r.memory_limit_bytes is not None]
    loosest = max(limits) if limits and len(limits) == len(results) else None
    merged = merged.replace(
        peak_memory_bytes=max(peaks) if peaks else None, memory_limit_bytes=loosest
    )
    write_atomic(trial_dir / RESULT_NAME, merged.to_json())
