"""The report's charts (matplotlib, Agg): every figure is drawn from records, no I/O
beyond the PNG written."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.core.enums import Outcome
from autotune.core.spec import SearchSpec
from autotune.core.trial import TrialRecord
from autotune.core.units import format_size
from autotune.tuning.selection import select_for
from autotune.views._insight import Insight, pareto_front

GIB = float(2**30)
COLOURS = {
    "ok": "#2a9d3f",
    "unstable": "#e0a800",
    "oom": "#d62828",
    "skipped": "#999999",
    "timeout": "#8e44ad",
    "error": "#555555",
}


def _pyplot() -> Any:
    """matplotlib.pyplot, drawing to files (Agg)."""
    import matplotlib  # heavy: imported when a chart is drawn, not with the report

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # once the backend is chosen

    return plt


def _save(fig: Any, path: Path) -> None:
    plt = _pyplot()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_ranked(records: Sequence[TrialRecord], found: Insight, path: Path) -> None:
    """Every measured config sorted by samples/s, with its spread as a whisker; the winner,
    the reference (plain default) and the band of configs that tie with the winner."""
    shown = sorted(
        (r for r in records if r.result.samples_per_s), key=lambda r: r.result.samples_per_s or 0.0
    )[-25:]
    fig, ax = _pyplot().subplots(figsize=(8, 0.9 + 0.28 * max(1, len(shown))), dpi=110)
    for i, r in enumerate(shown):
        sps = r.result.samples_per_s or 0.0
        spread = (r.result.step_time_spread or 0.0) * sps / 2
        edge = "black" if found.best and r.number == found.best.number else "none"
        ax.barh(
            i,
            sps,
            xerr=spread,
            color=COLOURS[r.result.outcome.value],
            edgecolor=edge,
            linewidth=1.5,
            error_kw={"elinewidth": 1, "capsize": 2},
        )
    labels = [f"{r.number}: {r.candidate.describe()}" for r in shown]
    ax.set_yticks(range(len(shown)), labels, fontsize=7)
    _marks(ax, found)
    ax.set_xlim(left=0)
    ax.set_xlabel("samples/s (whisker: interquartile spread of step times)")
    ax.set_title("Configs by throughput (outlined: selected)", loc="left")
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path)


def _marks(ax: Any, found: Insight) -> None:
    """The winner's tie band and the reference's line, with their legend."""
    if found.best is not None:
        top = found.best.result.samples_per_s or 0.0
        ax.axvspan(
            top * (1 - found.band),
            top,
            color="#f4a261",
            alpha=0.25,
            label=f"tie band (±{100 * found.band:.0f}%)",
        )
    if found.reference is not None:
        ax.axvline(
            found.reference.result.samples_per_s or 0.0,
            color="#264653",
            ls="--",
            lw=1,
            label=f"reference: plain default (trial {found.reference.number})",
        )
    if found.best is not None or found.reference is not None:
        ax.legend(fontsize=7, loc="lower right")


def plot_tradeoff(records: Sequence[TrialRecord], spec: SearchSpec, path: Path) -> None:
    """Every trial's samples/s against its peak, the Pareto front, the selected config and
    the budget."""
    fig, ax = _pyplot().subplots(figsize=(8, 5), dpi=110)
    _points(ax, records, spec)
    right = _budget_lines(ax, records, spec)
    ax.set_xlim(0, right)
    ax.set_ylim(0, 1.1 * max((r.result.samples_per_s or 0 for r in records), default=1.0))
    ax.set_xlabel("peak memory (GiB)")
    ax.set_ylabel("samples/s")
    ax.set_title("Throughput against peak memory, every trial", loc="left")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    _save(fig, path)


def _points(ax: Any, records: Sequence[TrialRecord], spec: SearchSpec) -> None:
    """The trials by outcome, the Pareto front through them, the selected one starred."""
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
    best = select_for(spec, records)
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


def _budget_lines(ax: Any, records: Sequence[TrialRecord], spec: SearchSpec) -> float:
    """The budget and the limit less headroom, where they do not squash the points;
    returns the axis' right end."""
    peaks = [(r.result.peak_memory_bytes or 0) / GIB for r in records]
    right = 1.15 * max(peaks, default=1.0)
    limit = spec.fit_limit_bytes / GIB
    if limit > 1.5 * right:
        ax.set_title(
            f"budget {format_size(spec.memory_budget_bytes)}: off the chart",
            loc="right",
            fontsize=8,
        )
        return right
    ax.axvline(
        spec.memory_budget_bytes / GIB,
        color="#d62828",
        ls="--",
        lw=1,
        label=f"budget {format_size(spec.memory_budget_bytes)}",
    )
    ax.axvline(limit, color="#d62828", ls=":", lw=1, label="budget less headroom")
    return max(right, 1.05 * spec.memory_budget_bytes / GIB)


def plot_by_batch(records: Sequence[TrialRecord], path: Path) -> None:
    fig, ax = _pyplot().subplots(figsize=(8, 5), dpi=110)
    families: dict[str, list[TrialRecord]] = {}
    for r in records:  # one line per setting other than the batch ("batch 8x2 " dropped)
        if r.result.outcome == Outcome.OK:
            families.setdefault(r.candidate.describe().split(" ", 2)[2], []).append(r)
    for label, group in sorted(families.items()):
        group.sort(key=lambda r: r.candidate.per_device_train_batch_size)
        ax.plot(
            [r.candidate.per_device_train_batch_size for r in group],
            [r.result.samples_per_s or 0 for r in group],
            marker="o",
            label=label,
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
    _save(fig, path)
