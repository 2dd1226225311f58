"""`search --format json`: what a script needs from a finished search."""

from __future__ import annotations

import json

from autotune.core.trial import TrialRecord
from autotune.tuning.outcome import SearchOutcome


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
        **record.candidate.lever_values(),
        "samples_per_s": r.samples_per_s,
        "one_time_s": r.one_time_s,
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
            "train_steps": outcome.train_steps or None,
            "time_to_finish_s": outcome.best.result.time_to_finish_s(outcome.train_steps)
            if outcome.train_steps
            else None,
            "script_changes": list(outcome.script_changes),
            "versus_default": _versus(outcome),
        },
        indent=2,
    )


def versus_line(outcome: SearchOutcome) -> list[str]:
    """The best's speed over the plain default's, with the range their steps allow."""
    default, ratio = outcome.default, outcome.versus_default
    if default is None or ratio is None:
        return []
    return [
        f"{ratio.describe()} the speed of {outcome.baseline} (trial {default.number}, "
        f"{default.candidate.describe()}: {default.result.samples_per_s:.2f} samples/s)"
    ]


def change_lines(parity: dict[str, object]) -> list[str]:
    """The exported config against the user's recipe, for the end of a search."""
    lines = [f"against your recipe ({parity['reference']}):"]
    kept = parity["keeps_arithmetic"]
    altered = parity["alters_arithmetic"]
    assert isinstance(kept, list) and isinstance(altered, list)
    rehearsal = [str(parity["rehearsal"])] if parity.get("rehearsal") else []
    tie = [f"  {parity['kept_arithmetic']}"] if parity.get("kept_arithmetic") else []
    if not kept and not altered:
        return [*lines, "  nothing changed", *tie, *rehearsal]
    if kept:
        lines.append(f"  keeps the arithmetic: {'; '.join(kept)}")
    if altered:
        lines.append(f"  alters the arithmetic: {'; '.join(altered)}")
        lines.append(f"  training parity: {parity['verdict']}")
    if parity.get("unverified_gain"):
        lines.append(f"  {parity['unverified_gain']}")
    return [*lines, *tie, *rehearsal]


def finish_lines(record: TrialRecord, train_steps: int) -> list[str]:
    """Time to finish the user's run (one-time costs apart), and what their script needs
    besides the arguments file (the attention implementation, the collator)."""
    r = record.result
    lines = []
    if train_steps and r.step_time_median_s is not None:
        lines.append(
            f"time to finish {train_steps} steps: {r.time_to_finish_s(train_steps):.0f} s "
            f"= {r.one_time_s or 0.0:.1f} s once (setup, compilation, first steps) + "
            f"{train_steps} x {r.step_time_median_s:.3f} s"
        )
    elif r.one_time_s and record.candidate.levers.compiles:
        lines.append(
            f"compiled: {r.one_time_s:.1f} s once (compilation, first steps) before "
            "the measured speed; pass --train-steps to weigh it"
        )
    return lines


def _versus(outcome: SearchOutcome) -> dict[str, object] | None:
    ratio, default = outcome.versus_default, outcome.default
    if ratio is None or default is None:
        return None
    return {
        "against": outcome.baseline,
        "trial": default.number,
        "config": default.candidate.describe(),
        "ratio": round(ratio.value, 3),
        "low": round(ratio.low, 3),
        "high": round(ratio.high, 3),
        "tie": ratio.tie,
    }
