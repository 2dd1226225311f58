"""`search --format json`: what a script needs from a finished search."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from autotune.core.trial import TrialRecord

if TYPE_CHECKING:
    from autotune.commands import SearchOutcome


def record_dict(record: TrialRecord) -> dict[str, object]:
    r = record.result
    return {
        "trial": record.number,
        "config": record.candidate.describe(),
        "per_device_train_batch_size": record.candidate.per_device_train_batch_size,
        "gradient_accumulation_steps": record.candidate.gradient_accumulation_steps,
        "precision": str(record.candidate.precision),
        "activation_checkpointing": record.candidate.activation_checkpointing,
        "optim": record.candidate.optim,
        "samples_per_s": r.samples_per_s,
        "tokens_per_s": r.tokens_per_s,
        "peak_memory_bytes": r.peak_memory_bytes,
        "step_time_spread": r.step_time_spread,
        "runs": record.runs,
    }


def outcome_json(outcome: SearchOutcome) -> str:
    return json.dumps(
        {
            "study": outcome.study_name,
            "output": str(outcome.output),
            "best": record_dict(outcome.best),
            "probes_this_run": outcome.probes_this_run,
            "elapsed_s": round(outcome.elapsed_s, 1),
            "stop_reason": outcome.stop_reason,
            "parity": outcome.parity,
        },
        indent=2,
    )


def change_lines(parity: dict[str, object]) -> list[str]:
    """The exported config against the user's recipe, for the end of a search."""
    lines = [f"against your recipe ({parity['reference']}):"]
    kept = parity["keeps_arithmetic"]
    altered = parity["alters_arithmetic"]
    assert isinstance(kept, list) and isinstance(altered, list)
    if not kept and not altered:
        return [*lines, "  nothing changed"]
    if kept:
        lines.append(f"  keeps the arithmetic: {'; '.join(kept)}")
    if altered:
        lines.append(f"  alters the arithmetic: {'; '.join(altered)}")
        lines.append(f"  training parity: {parity['verdict']}")
    return lines
