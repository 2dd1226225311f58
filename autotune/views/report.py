"""`autotune report`: a self-contained HTML page and PNG charts of a study.

Calculation (Pareto front, baseline) is apart from drawing (matplotlib, Agg) and from
the page (HTML with the PNGs inlined), so each can be checked alone.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

from autotune.core.enums import Outcome
from autotune.core.files import write_atomic
from autotune.core.spec import SearchSpec
from autotune.core.trial import TrialRecord
from autotune.core.units import format_size
from autotune.search.selection import fitting, select_best
from autotune.views.show import TrialRow

GIB = float(2**30)
COLOURS = {
    "ok": "#2a9d3f",
    "unstable": "#e0a800",
    "oom": "#d62828",
    "skipped": "#999999",
    "timeout": "#8e44ad",
    "error": "#555555",
}


def pareto_front(records: Sequence[TrialRecord], fit_limit_bytes: int) -> list[TrialRecord]:
    """Fitting trials no other fitting trial beats on both throughput and memory."""
    pool = fitting(records, fit_limit_bytes)
    front = [
        r
        for r in pool
        if not any(
            (o.result.samples_per_s or 0) >= (r.result.samples_per_s or 0)
            and (o.result.peak_memory_bytes or 0) <= (r.result.peak_memory_bytes or 0)
            and o is not r
            and (
                (o.result.samples_per_s or 0) > (r.result.samples_per_s or 0)
                or (o.result.peak_memory_bytes or 0) < (r.result.peak_memory_bytes or 0)
            )
            for o in pool
        )
    ]
    return sorted(front, key=lambda r: r.result.peak_memory_bytes or 0)


def plain_default(records: Sequence[TrialRecord], spec: SearchSpec) -> TrialRecord | None:
    """The measured plain default: fp32, adamw_torch, no checkpointing, smallest regular batch."""
    batch = spec.space.micro_batches[0]
    for r in records:
        c = r.candidate
        if (c.precision, c.optim, c.activation_checkpointing, c.per_device_train_batch_size) == (
            "fp32",
            "adamw_torch",
            False,
            batch,
        ) and r.result.outcome == Outcome.OK:
            return r
    return None


def plot_tradeoff(records: Sequence[TrialRecord], spec: SearchSpec, path: Path) -> None:
    # long: one matplotlib call per element of the chart, in drawing order
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for outcome in Outcome:
        group = [r for r in records if r.result.outcome == outcome and r.result.peak_memory_bytes]
        if group:
            ax.scatter(
                [(r.result.peak_memory_bytes or 0) / GIB for r in group],
                [r.result.samples_per_s or 0.0 for r in group],
                c=COLOURS[outcome.value],
                label=f"{outcome.value} ({len(group)})",
                marker="o" if outcome == Outcome.OK else "x",
                s=40,
                zorder=3,
            )
    front = pareto_front(records, spec.fit_limit_bytes)
    if front:
        ax.step(
            [(r.result.peak_memory_bytes or 0) / GIB for r in front],
            [r.result.samples_per_s or 0 for r in front],
            where="post",
            color="#264653",
            lw=1.2,
            label="Pareto front",
            zorder=2,
        )
    best = select_best(records, fit_limit_bytes=spec.fit_limit_bytes)
    if best is not None:
        ax.scatter(
            [(best.result.peak_memory_bytes or 0) / GIB],
            [best.result.samples_per_s or 0],
            marker="*",
            s=260,
            c="#f4a261",
            edgecolors="black",
            zorder=4,
            label=f"selected (trial {best.number})",
        )
    ax.axvline(
        spec.memory_budget_bytes / GIB,
        color="#d62828",
        ls="--",
        lw=1,
        label=f"budget {format_size(spec.memory_budget_bytes)}",
    )
    ax.axvline(
        spec.fit_limit_bytes / GIB, color="#d62828", ls=":", lw=1, label="budget less headroom"
    )
    ax.set_xlabel("peak memory (GiB)")
    ax.set_ylabel("samples/s")
    ax.set_title("Throughput against peak memory, every trial")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_by_batch(records: Sequence[TrialRecord], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    families: dict[tuple[str, bool, str], list[TrialRecord]] = {}
    for r in records:
        if r.result.outcome == Outcome.OK:
            families.setdefault(r.candidate.family, []).append(r)
    for (precision, ckpt, optim), group in sorted(families.items()):
        group.sort(key=lambda r: r.candidate.per_device_train_batch_size)
        ax.plot(
            [r.candidate.per_device_train_batch_size for r in group],
            [r.result.samples_per_s or 0 for r in group],
            marker="o",
            label=f"{precision} {'ckpt' if ckpt else 'no-ckpt'} {optim}",
        )
    ax.set_xscale("log", base=2)
    batches = sorted(
        {r.candidate.per_device_train_batch_size for r in records if r.result.outcome == Outcome.OK}
    )
    if batches:
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
    ax.set_xlabel("per-device batch size")
    ax.set_ylabel("samples/s")
    ax.set_title("Throughput by batch size, per precision / checkpointing / optimizer")
    ax.grid(alpha=0.3)
    if families:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(
    *,
    records: Sequence[TrialRecord],
    rows: Sequence[TrialRow],
    spec: SearchSpec,
    study_name: str,
    output_dir: Path,
) -> list[Path]:
    """Write <study>.report.html and its two PNGs; returns their paths."""
    output_dir.mkdir(parents=True, exist_ok=True)
    tradeoff = output_dir / f"{study_name}.tradeoff.png"
    by_batch = output_dir / f"{study_name}.by-batch.png"
    plot_tradeoff(records, spec, tradeoff)
    plot_by_batch(records, by_batch)
    page = output_dir / f"{study_name}.report.html"
    write_atomic(page, _html(records, rows, spec, study_name, [tradeoff, by_batch]))
    return [page, tradeoff, by_batch]


def _html(  # long: the page's HTML, top to bottom
    records: Sequence[TrialRecord],
    rows: Sequence[TrialRow],
    spec: SearchSpec,
    study_name: str,
    images: list[Path],
) -> str:
    best = select_best(records, fit_limit_bytes=spec.fit_limit_bytes)
    default = plain_default(records, spec)
    summary = "<p>No config fits the budget.</p>"
    if best is not None:
        summary = (
            f"<p><b>Selected: trial {best.number}</b>, {html.escape(best.candidate.describe())}: "
            f"{best.result.samples_per_s:.2f} samples/s, peak "
            f"{format_size(best.result.peak_memory_bytes or 0)}.</p>"
        )
        if default is not None and default.result.samples_per_s:
            ratio = (best.result.samples_per_s or 0) / default.result.samples_per_s
            summary += (
                f"<p>Against the plain default (trial {default.number}, "
                f"{html.escape(default.candidate.describe())}: "
                f"{default.result.samples_per_s:.2f} samples/s, peak "
                f"{format_size(default.result.peak_memory_bytes or 0)}): "
                f"<b>{ratio:.2f}x</b> the throughput.</p>"
            )
        else:
            summary += (
                "<p>The plain default (fp32, adamw_torch, no checkpointing) was not measured.</p>"
            )
    pictures = "".join(
        f'<img alt="{html.escape(p.stem, quote=True)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}">'
        for p in images
    )
    header = ("trial", "config", "outcome", "samples/s", "peak GiB", "budget", "spread", "why")
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))}</td>"
            for v in (
                f"{row.trial}{' *' if row.best else ''}",
                row.config,
                row.outcome,
                "" if row.samples_per_s is None else f"{row.samples_per_s:.2f}",
                "" if row.peak_memory_gib is None else f"{row.peak_memory_gib:.2f}",
                "" if row.budget_used_pct is None else f"{row.budget_used_pct:.0f}%",
                "" if row.step_time_spread_pct is None else f"±{row.step_time_spread_pct:.0f}%",
                row.why,
            )
        )
        + "</tr>"
        for row in rows
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>autotune: {html.escape(study_name)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}img{{max-width:49%}}
table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px}}</style>
</head><body>
<h1>autotune study {html.escape(study_name)}</h1>
<p>{html.escape(spec.describe())}; {len(records)} trials.</p>
{summary}
{pictures}
<h2>Every trial</h2>
<table><tr>{"".join(f"<th>{h}</th>" for h in header)}</tr>{body}</table>
<p>* the config export writes.</p>
</body></html>
"""
