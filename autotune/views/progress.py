"""What the user sees while a search runs: a live table on a terminal, plain lines in logs."""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from autotune.views.show import data_lines
from autotune.search.run import SearchLimits, SearchReport
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, Outcome, TrialResult
from autotune.core.units import format_duration, format_size

_STYLE = {
    Outcome.OK: "green",
    Outcome.OOM: "red",
    Outcome.UNSTABLE: "yellow",
    Outcome.TIMEOUT: "magenta",
    Outcome.ERROR: "red",
    Outcome.SKIPPED: "dim",
}


def trial_line(number: int, candidate: Candidate, result: TrialResult) -> str:
    figures = ""
    if result.samples_per_s is not None:
        figures = f" {result.samples_per_s:8.2f} samples/s"
    if result.peak_memory_bytes is not None:
        figures += f"  peak {format_size(result.peak_memory_bytes)}"
    reason = f"  ({result.reason})" if result.reason else ""
    return f"trial {number:>3} {result.outcome.value:<8} {candidate.describe()}{figures}{reason}"


class Progress:
    """Observer of a search. `live=False` (or no terminal) prints one line per trial."""

    def __init__(self, console: Console, *, live: bool) -> None:
        self.console = console
        self.live_enabled = live and console.is_terminal
        self.rows: list[tuple[int, Candidate, TrialResult]] = []
        self.running: tuple[int, Candidate] | None = None
        self.started = time.monotonic()
        self.limits = SearchLimits()
        self.live: Live | None = None
        self.budget = 0

    def on_search_start(self, spec: SearchSpec, study_name: str, limits: SearchLimits) -> None:
        self.limits, self.started = limits, time.monotonic()
        self.budget = spec.fit_limit_bytes
        self.console.print(f"study {study_name}: {spec.describe()}")
        for line in data_lines(spec):
            self.console.print(line)
        if self.live_enabled:
            self.live = Live(self._table(), console=self.console, refresh_per_second=2)
            self.live.start()

    def on_trial_start(self, number: int, candidate: Candidate) -> None:
        self.running = (number, candidate)
        self._refresh()
        if not self.live:
            self.console.print(f"trial {number:>3} running  {candidate.describe()}", soft_wrap=True)

    def on_trial_end(self, number: int, candidate: Candidate, result: TrialResult) -> None:
        self.running = None
        self.rows.append((number, candidate, result))
        self._refresh()
        if not self.live:
            self.console.print(trial_line(number, candidate, result), soft_wrap=True)

    def on_confirm(self, number: int, candidate: Candidate, result: TrialResult) -> None:
        line = trial_line(number, candidate, result).replace("trial", "confirm", 1)
        self.console.print(line, soft_wrap=True)

    def close(self) -> None:
        """Stop the live display (also when the search ends by an exception)."""
        if self.live:
            self.live.update(self._table())
            self.live.stop()
            self.live = None

    def on_search_end(self, report: SearchReport) -> None:
        self.close()
        self.console.print(
            f"stopped: {report.stop_reason}; {report.probes_this_run} probe(s) this run, "
            f"{len(report.records)} trial(s) in the study, {format_duration(report.elapsed_s)}"
        )

    def _refresh(self) -> None:
        if self.live:
            self.live.update(self._table())

    def _table(self) -> Table:
        elapsed = time.monotonic() - self.started
        budget = self.limits.time_budget_s
        left = f", {format_duration(budget - elapsed)} left" if budget else ""
        best = max(
            (
                r.samples_per_s or 0.0
                for _, _, r in self.rows
                if r.outcome == Outcome.OK and (r.peak_memory_bytes or 0) <= self.budget
            ),
            default=None,
        )
        title = f"elapsed {format_duration(elapsed)}{left}" + (
            f"; best {best:.2f} samples/s" if best else ""
        )
        table = Table(title=title)
        for column in ("trial", "config", "outcome", "samples/s", "peak", "note"):
            table.add_column(column)
        for number, candidate, result in self.rows[-15:]:
            table.add_row(
                str(number),
                candidate.describe(),
                f"[{_STYLE[result.outcome]}]{result.outcome.value}[/]",
                f"{result.samples_per_s:.2f}" if result.samples_per_s else "",
                format_size(result.peak_memory_bytes) if result.peak_memory_bytes else "",
                result.reason[:40],
            )
        if self.running:
            table.add_row(str(self.running[0]), self.running[1].describe(), "running…", "", "", "")
        return table
