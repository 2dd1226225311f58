"""`autotune report`: a self-contained HTML page (charts inlined) and the PNGs.

Read in ten seconds: what won and by how much against the plain default, whether it
ties with others, the lines to paste into your run, what it changes, the charts, every
trial with a note, and what the search cost. Meaning is computed in `_insight`, drawing
in `_charts`; this module only lays the page out, escaping everything a user supplied.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

from autotune.core.enums import Objective
from autotune.core.files import write_atomic
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialRecord
from autotune.core.units import format_duration, format_size
from autotune.hf.training_args import cli_flags, study_arguments
from autotune.tuning.selection import compare
from autotune.views._charts import plot_by_batch, plot_ranked, plot_tradeoff
from autotune.views._insight import Insight, insight, note
from autotune.views.show import TrialRow

STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
img{max-width:100%}.charts img{max-width:49%}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px}
pre{background:#f4f4f4;padding:.6em;white-space:pre-wrap}.alter{color:#b5179e}.keep{color:#2a9d3f}.big{font-size:1.25em}"""


def write_report(
    *,
    records: Sequence[TrialRecord],
    rows: Sequence[TrialRow],
    spec: SearchSpec,
    study_name: str,
    output_dir: Path,
    recipe: Candidate | None = None,
    objective: Objective = Objective.THROUGHPUT,
) -> list[Path]:
    """Write <study>.report.html and its three PNGs, the best selected by `objective`;
    returns their paths."""
    output_dir.mkdir(parents=True, exist_ok=True)
    found = insight(records, spec, recipe, objective)
    ranked = output_dir / f"{study_name}.ranked.png"
    tradeoff = output_dir / f"{study_name}.tradeoff.png"
    by_batch = output_dir / f"{study_name}.by-batch.png"
    plot_ranked(records, found, ranked)
    plot_tradeoff(records, spec, tradeoff)
    plot_by_batch(records, by_batch)
    page = output_dir / f"{study_name}.report.html"
    images = [ranked, tradeoff, by_batch]
    write_atomic(page, _html(records, rows, spec, study_name, images, found))
    return [page, ranked, tradeoff, by_batch]


def _headline(found: Insight, spec: SearchSpec) -> str:
    best, ref = found.best, found.reference
    if best is None:
        return "<p class='big'>No config fits the budget.</p>"
    sps = best.result.samples_per_s or 0.0
    peak = best.result.peak_memory_bytes or 0
    versus = ""
    ratio = compare(best, ref) if ref and ref.number != best.number else None
    if ref is not None and ratio is not None:
        versus = (
            f" = <b>{html.escape(ratio.describe())}</b> the speed of {found.reference_name} (trial "
            f"{ref.number}, {ref.result.samples_per_s:.2f} samples/s)"
        )
    ties = [n for n in found.ties if n != best.number]
    tie = ""
    if ties:
        tie = (
            f"<p>Trials {', '.join(map(str, ties))} tie with it within the measurement "
            f"noise (±{100 * found.band:.0f}%); among ties one that keeps your recipe's "
            "precision and optimizer wins, then the least memory.</p>"
        )
    per_gib = ""
    if found.objective == Objective.EFFICIENCY and peak:
        per_gib = f" ({sps / (peak / 2**30):.2f} samples/s per GiB of peak: the best per memory)"
    return (
        f"<p class='big'><b>Selected: trial {best.number}</b>, "
        f"{html.escape(best.candidate.describe())}: {sps:.2f} samples/s{per_gib}{versus}; peak "
        f"{format_size(peak)} of a {format_size(spec.memory_budget_bytes)} budget"
        f"{'; confirmed in ' + str(best.runs) + ' runs' if best.runs > 1 else ''}.</p>{tie}"
    )


def _hand_off(found: Insight, spec: SearchSpec, study_name: str) -> str:
    if found.best is None:
        return ""
    flags = cli_flags(study_arguments(spec, found.best.candidate))
    name = html.escape(study_name)
    return (
        "<h2>Into your run</h2><pre>"
        f"autotune export --study {name} --merge-into your_args.json\n"
        f"# or, as flags:\n{html.escape(flags)}</pre>"
    )


def _changes(found: Insight) -> str:
    if found.best is None:
        return ""
    if not found.changes:
        return "<h2>What changed</h2><p>Nothing: your recipe is the winner.</p>"
    parity = found.best.parity
    checked = parity.figures() if parity else "training parity not checked (--parity off)"
    kinds = {
        False: ("alter", f"alters the arithmetic of training; {checked}"),
        True: ("keep", "speed and memory only"),
    }
    items = "".join(
        f"<li class='{kinds[c.keeps_arithmetic][0]}'>{html.escape(c.describe())} "
        f"({html.escape(kinds[c.keeps_arithmetic][1])})</li>"
        for c in found.changes
    )
    return f"<h2>What changed against your recipe</h2><ul>{items}</ul>"


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem, quote=True)}" src="data:image/png;base64,{data}">'


def _table(records: Sequence[TrialRecord], rows: Sequence[TrialRow], found: Insight) -> str:
    by_number = {r.number: r for r in records}
    header = (
        "trial",
        "config",
        "outcome",
        "samples/s",
        "peak GiB",
        "budget",
        "spread",
        "parity",
        "note",
    )
    body = []
    for row in rows:
        record = by_number.get(row.trial)
        why = row.why or (note(record, found) if record else "")
        cells = (
            f"{row.trial}{' *' if row.best else ''}",
            row.config,
            row.outcome,
            "" if row.samples_per_s is None else f"{row.samples_per_s:.2f}",
            "" if row.peak_memory_gib is None else f"{row.peak_memory_gib:.2f}",
            "" if row.budget_used_pct is None else f"{row.budget_used_pct:.0f}%",
            "" if row.step_time_spread_pct is None else f"±{row.step_time_spread_pct:.0f}%",
            row.parity if row.outcome == "ok" else "",
            why,
        )
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in header)
    return f"<h2>Every trial</h2><table><tr>{head}</tr>{''.join(body)}</table>"


def _footer(records: Sequence[TrialRecord], spec: SearchSpec, found: Insight) -> str:
    versions = next((r.result.versions for r in records if r.result.versions), {})
    shown = ", ".join(f"{k} {v}" for k, v in versions.items())
    return (
        f"<p>{found.probes} probe runs (confirmations included), about "
        f"{format_duration(found.probe_seconds)} of probing; device {spec.device.kind} "
        f"{html.escape(spec.device.name)}; {html.escape(shown)}.</p>"
    )


def _html(
    records: Sequence[TrialRecord],
    rows: Sequence[TrialRow],
    spec: SearchSpec,
    study_name: str,
    images: list[Path],
    found: Insight,
) -> str:
    name = html.escape(study_name)
    first, *rest = images
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>autotune: {name}</title><style>{STYLE}</style></head>
<body><h1>autotune study {name}</h1>
<p>{html.escape(spec.describe())}; {len(records)} trials.</p>
{_headline(found, spec)}
{_hand_off(found, spec, study_name)}
{_changes(found)}
<h2>Charts</h2>{_image(first)}<div class="charts">{"".join(_image(p) for p in rest)}</div>
{_table(records, rows, found)}
<p>* the config export writes.</p>
{_footer(records, spec, found)}
</body></html>
"""
