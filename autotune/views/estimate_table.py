"""`autotune estimate`: the memory breakdown as a table."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from autotune.core.enums import Task
from autotune.core.units import format_size
from autotune.tuning.estimate import Estimate

COLUMNS = (
    "precision",
    "optim",
    "checkpointing",
    "bytes/param",
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "embedding grads",
    "optimizer step",
    "total",
)


def print_estimate(estimate: Estimate) -> None:
    e = estimate
    target = f" / {e.target_len} target" if e.task == Task.SEQ2SEQ else ""
    trains = f", {e.trainable / 1e6:.2f}M of them train" if e.trainable else ""
    table = Table(
        title=f"{e.model} ({e.task}, {e.parameters / 1e6:.1f}M parameters{trains}): "
        f"per-device batch {e.batch}, {e.seq_len} tokens{target}; + about "
        f"{format_size(e.process_bytes)} for the process",
        title_justify="left",
    )
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("precision", "optim") else "right")
    for row in e.rows:
        c, b = row.candidate, row.breakdown
        table.add_row(
            str(c.precision),
            c.optim,
            str(c.activation_checkpointing),
            f"{b.static / e.parameters:.0f}",
            format_size(b.weights),
            format_size(b.gradients),
            format_size(b.optimizer_state),
            format_size(b.activations),
            format_size(b.embedding_grads),
            format_size(b.step),
            format_size(b.total),
        )
    Console(width=160, markup=False).print(table)


def estimate_json(estimate: Estimate) -> str:
    e = estimate
    rows = [
        {
            "precision": str(r.candidate.precision),
            "optim": r.candidate.optim,
            "activation_checkpointing": r.candidate.activation_checkpointing,
            "weights_bytes": r.breakdown.weights,
            "gradients_bytes": r.breakdown.gradients,
            "optimizer_state_bytes": r.breakdown.optimizer_state,
            "activations_bytes": r.breakdown.activations,
            # temporaries once the activations are freed: backward's end, the step
            "embedding_gradient_bytes": r.breakdown.embedding_grads,
            "optimizer_step_bytes": r.breakdown.step,
            "total_bytes": r.breakdown.total,
        }
        for r in e.rows
    ]
    head = {
        "model": e.model,
        "task": e.task,
        "parameters": e.parameters,
        "trainable_parameters": e.trainable or e.parameters,
        "batch": e.batch,
        "seq_len": e.seq_len,
        "target_len": e.target_len,
        "process_bytes": e.process_bytes,
    }
    return json.dumps({**head, "rows": rows}, indent=2)
