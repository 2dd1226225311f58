"""`autotune show`: every trial of a study, best first, with why each non-ok one failed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from autotune.core.enums import Objective, Outcome, Precision
from autotune.core.spec import SearchSpec
from autotune.core.trial import TrialRecord
from autotune.core.units import format_size
from autotune.hf.training_args import study_arguments
from autotune.tuning import predicted_peak, process_bytes
from autotune.tuning.selection import ranked, select_export
from autotune.views.summary import change_lines

GIB = float(2**30)


@dataclasses.dataclass(frozen=True)
class TrialRow:
    trial: int
    best: bool
    config: str
    training_arguments: dict[str, Any]
    outcome: str
    samples_per_s: float | None
    tokens_per_s: float | None
    peak_memory_gib: float | None
    budget_used_pct: float | None
    step_time_spread_pct: float | None
    mfu_pct: float | None
    why: str
    # With --dataset, or a user's job whose padding is searched: samples/s and tokens/s
    # (real, non-pad) are on their real batches; these are the pad share of the timed
    # real batches and the worst case's samples/s.
    padding_pct: float | None = None
    worst_case_samples_per_s: float | None = None
    # Training parity with the user's recipe: same-arithmetic, ok, diverged or unchecked
    parity: str = "unchecked"
    parity_figures: str = ""
    one_time_s: float | None = None  # setup + compilation + slow first steps
    finish_s: float | None = None  # the user's --train-steps at this speed, one-time included
    reused_from: str = ""  # "study S trial N": figures taken over, not probed in this study
    mfu_unknown: str = ""  # why no MFU is shown though the figures were measured
    # The analytic estimate of the peak (the job as held, the process as measured), set
    # beside the measured one: how far the model of memory is from this job
    predicted_peak_gib: float | None = None
    # samples/s per GiB of peak: what --objective efficiency selects by
    samples_per_s_per_gib: float | None = None
    # Packed rows: the samples (at the data's mean length) a step trained; its samples/s
    # and step times count those, as the recipe's steps of the global batch
    samples_per_step: float | None = None


def explain(record: TrialRecord, spec: SearchSpec) -> str:
    """Why a trial is not a candidate, in a few words ('' for a clean ok), and where its
    figures came from when another study measured them."""
    why = _why(record, spec)
    reused = record.result.reused_from
    return "; ".join(filter(None, (why, f"reused: {reused}" if reused else "")))


def _why(record: TrialRecord, spec: SearchSpec) -> str:
    r = record.result
    if record.parity and record.parity.blocks_export:
        return record.parity.figures()
    if record.rehearsal is not None and record.rehearsal.blocks_export:
        return record.rehearsal.describe()
    if r.outcome == Outcome.OOM:
        at = f" at {format_size(r.peak_memory_bytes)}" if r.peak_memory_bytes else ""
        return f"OOM{at} of {format_size(spec.fit_limit_bytes)}"
    if r.outcome == Outcome.OK and (r.peak_memory_bytes or 0) > spec.fit_limit_bytes:
        return (
            f"peak {format_size(r.peak_memory_bytes or 0)} over {format_size(spec.fit_limit_bytes)}"
        )
    return r.reason


def _as_loaded(record: TrialRecord) -> str:
    """Why an as-loaded probe has no MFU: no peak of the dtype it computes in is taken."""
    if record.candidate.precision != Precision.AS_LOADED or not record.result.model_flops_per_s:
        return ""
    return "as-loaded computes in your weights' own dtype, whose peak is not measured"


def trial_rows(
    records: Sequence[TrialRecord], spec: SearchSpec, objective: Objective, *, rehearse: bool = True
) -> list[TrialRow]:
    """A row a trial, best first: the best is what an export would write (`rehearse`:
    among the configs their rehearsal cleared, where the run evaluates or saves)."""
    best = select_export(spec, records, objective, rehearse=rehearse)
    rows = []
    process = process_bytes(spec.device.kind, records)
    for record in ranked(records):
        r = record.result
        peak = r.peak_memory_bytes
        predicted = predicted_peak(spec, record.candidate, process)
        rows.append(
            TrialRow(
                trial=record.number,
                best=best is not None and record.number == best.number,
                config=record.candidate.describe(),
                training_arguments=study_arguments(spec, record.candidate),
                outcome=r.outcome.value,
                samples_per_s=_round(r.samples_per_s, 3),
                tokens_per_s=_round(r.tokens_per_s, 1),
                peak_memory_gib=_round(peak / GIB if peak else None, 3),
                predicted_peak_gib=_round(predicted / GIB if predicted else None, 3),
                samples_per_s_per_gib=_round(
                    r.samples_per_s / (peak / GIB) if r.samples_per_s and peak else None, 3
                ),
                budget_used_pct=_round(100 * peak / spec.memory_budget_bytes if peak else None, 1),
                step_time_spread_pct=_round(
                    100 * r.step_time_spread if r.step_time_spread is not None else None, 1
                ),
                mfu_pct=_round(100 * r.mfu if r.mfu is not None else None, 1),
                why=explain(record, spec),
                padding_pct=_round(
                    100 * r.padding_fraction if r.padding_fraction is not None else None, 1
                ),
                worst_case_samples_per_s=_round(r.worst_case_samples_per_s, 3),
                parity=str(record.parity.status) if record.parity else "unchecked",
                parity_figures=record.parity.figures() if record.parity else "",
                one_time_s=_round(r.one_time_s, 1),
                finish_s=_round(r.time_to_finish_s(spec.train_steps), 1)
                if spec.train_steps
                else None,
                reused_from=r.reused_from,
                mfu_unknown=r.mfu_unknown or _as_loaded(record),
                samples_per_step=r.samples_per_step,
            )
        )
    # The selected trial first, then the rest as ranked.
    return sorted(rows, key=lambda row: not row.best)


def rows_json(rows: Sequence[TrialRow], spec: SearchSpec, study_name: str) -> str:
    return json.dumps(
        {
            "study": study_name,
            "description": spec.describe(),
            "memory_budget_bytes": spec.memory_budget_bytes,
            "data": spec.data.summary() if spec.data else None,
            "train_steps": spec.train_steps or None,
            "levers": {name: list(values) for name, values in spec.space.levers},
            "levers_not_offered": dict(spec.space.not_offered),
            "trials": [dataclasses.asdict(row) for row in rows],
        },
        indent=2,
    )


def data_lines(spec: SearchSpec) -> list[str]:
    """The dataset in a few lines: lengths, truncation, padding waste per sampling."""
    data = spec.data
    if data is None:
        return []
    lines = [data.describe()]
    if data.target_lengths is not None:
        lines.append(f"targets: {data.target_lengths.describe()}")
    waste = ", ".join(
        f"batch {b}: {100 * w['random']:.0f}% random, {100 * w['group_by_length']:.0f}% grouped"
        for b, w in sorted(data.padding_waste.items(), key=lambda item: int(item[0]))
    )
    lines.append(f"padding waste (pad share of tokens fed): {waste}")
    return lines


def render_table(
    rows: Sequence[TrialRow],
    spec: SearchSpec,
    study_name: str,
    objective: Objective = Objective.THROUGHPUT,
) -> Table:
    table = Table(title=f"{study_name}: {spec.describe()}", title_justify="left")
    real = spec.data is not None or spec.own_batches
    per_gib = objective == Objective.EFFICIENCY
    columns = ["trial", "config", "outcome", "samples/s"]
    columns += ["samples/s per GiB"] if per_gib else []
    columns += ["real tokens/s" if real else "tokens/s"]
    columns += ["pad", "worst-case samples/s"] if real else []
    timed = spec.train_steps > 0 or any(row.one_time_s for row in rows)
    columns += ["setup s"] if timed else []
    columns += [f"{spec.train_steps} steps"] if spec.train_steps else []
    columns += ["peak", "estimate", "budget", "spread", "MFU", "parity", "why"]
    for column in columns:
        table.add_column(column, justify="right" if "/s" in column else "left")
    for row in rows:
        cells = [
            f"{row.trial}{' *' if row.best else ''}",
            row.config
            + (f" ({row.samples_per_step:g} samples a step)" if row.samples_per_step else ""),
            row.outcome,
            _fmt(row.samples_per_s, ".2f"),
            *([_fmt(row.samples_per_s_per_gib, ".2f")] if per_gib else []),
            _fmt(row.tokens_per_s, ".0f"),
        ]
        if real:
            cells += [
                f"{row.padding_pct:.0f}%" if row.padding_pct is not None else "",
                _fmt(row.worst_case_samples_per_s, ".2f"),
            ]
        cells += [_fmt(row.one_time_s, ".1f")] if timed else []
        cells += [_duration(row.finish_s)] if spec.train_steps else []
        cells += [
            f"{row.peak_memory_gib:.2f} GiB" if row.peak_memory_gib is not None else "",
            f"{row.predicted_peak_gib:.2f} GiB" if row.predicted_peak_gib is not None else "",
            f"{row.budget_used_pct:.0f}%" if row.budget_used_pct is not None else "",
            f"±{row.step_time_spread_pct:.0f}%" if row.step_time_spread_pct is not None else "",
            f"{row.mfu_pct:.1f}%" if row.mfu_pct is not None else "-" if row.mfu_unknown else "",
            "" if row.outcome != "ok" else row.parity,
            row.why,
        ]
        table.add_row(*cells)
    return table


def print_table(
    rows: Sequence[TrialRow],
    spec: SearchSpec,
    study_name: str,
    objective: Objective = Objective.THROUGHPUT,
) -> None:
    console = Console(highlight=False, width=200, markup=False)
    for line in data_lines(spec):
        console.print(line)
    console.print(render_table(rows, spec, study_name, objective))
    console.print(
        "* the config export writes; parity: whether it learns like your recipe "
        "(same-arithmetic: only the batch split, checkpointing or a fused kernel differ); "
        "estimate: the analytic peak before any probe (weights as your job holds them, "
        "gradients and optimizer state for what trains, activations, this study's process)"
    )
    if spec.data is not None:
        console.print(
            "samples/s and real tokens/s: real batches of your data, padded per micro-batch, "
            "at the median step, by which configs are ranked; peak memory: worst-case batches"
        )
    elif spec.own_batches:
        console.print(
            "samples/s and real tokens/s: your own batches, in your order, at the median step, "
            "by which configs are ranked (their padding is searched); peak memory: batches "
            "of your longest samples"
        )
    elif objective == Objective.EFFICIENCY:
        console.print(
            "the * has the most samples/s per GiB of peak memory (objective efficiency): "
            "the best throughput per memory"
        )
    elif objective == Objective.THROUGHPUT:
        console.print(
            "samples/s, tokens/s: at the median step. The * ranks first by the quiet step (a "
            "probe's lower quartile: a busy host slows it least), ties going to one that keeps "
            "your recipe's precision and optimizer, then to the smaller peak; a change of "
            "them that parity did not verify only where paired rounds show it significantly faster"
        )
    for line in lever_lines(spec):
        console.print(line)


def lever_lines(spec: SearchSpec) -> list[str]:
    """The levers searched beyond the classic five, and why the others were not."""
    lines = []
    searched = [f"{n} ({', '.join(map(str, v))})" for n, v in spec.space.varied_levers.items()]
    if searched:
        lines.append(f"levers searched: {'; '.join(searched)}")
    if spec.train_steps:
        lines.append(
            f"selected by time to finish {spec.train_steps} steps: setup (compilation, "
            "slow first steps; the 'setup s' column) + the steps at the ranked step time "
            f"(the '{spec.train_steps} steps' column: at the median step)"
        )
    lines += [f"not searched: {name}: {why}" for name, why in spec.space.not_offered if why]
    return lines


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


@dataclasses.dataclass(frozen=True)
class StudyView:
    """What `show` returns: the study's spec and its rows, best first."""

    study_name: str
    spec: SearchSpec
    rows: list[TrialRow]
    parity: dict[str, Any] | None = None  # the selected config against the user's recipe
    objective: Objective = Objective.THROUGHPUT  # what the * was selected by


def print_view(view: StudyView, fmt: str) -> None:
    if fmt == "json":
        raw = json.loads(rows_json(view.rows, view.spec, view.study_name))
        print(json.dumps({**raw, "parity": view.parity}, indent=2))
        return
    print_table(view.rows, view.spec, view.study_name, view.objective)
    if view.parity is not None:
        for line in change_lines(view.parity):
            print(line)
