"""What the user sees while a search runs: a live table on a terminal, plain lines in logs."""

from __future__ import annotations

import dataclasses
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autotune.core.enums import DeviceKind, Outcome
from autotune.core.parity_verdict import Parity
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialResult
from autotune.core.units import format_duration, format_size
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.tuning.outcome import SearchReport
from autotune.views.show import data_lines

_STYLE = {
    Outcome.OK: "green",
    Outcome.OOM: "red",
    Outcome.UNSTABLE: "yellow",
    Outcome.TIMEOUT: "magenta",
    Outcome.ERROR: "red",
    Outcome.SKIPPED: "dim",
}


# What each parity run is, said beside it (docs/glossary.md)
_PARITY_ROLES = {
    # the recipe's arithmetic as its quickest measured config trains it (quickest_alike):
    # another split or kernel than the recipe's own, at times
    "reference": "your recipe's arithmetic",
    "twin": "your recipe at another batch split: what rounding alone does",
}

SHORT_STEP_S = 0.05  # below this a step is mostly kernel-launch overhead on a GPU


def short_step_note(result: TrialResult, device_kind: str) -> str:
    """On a GPU, a warning when steps are so short that launch overhead dominates them."""
    step = result.step_time_median_s
    if device_kind != DeviceKind.CUDA or step is None or step >= SHORT_STEP_S:
        return ""
    return (
        f"; steps of {1000 * step:.0f} ms are mostly launch overhead: a larger "
        "micro-batch (--global-batch-size) measures the model, not the launches"
    )


def measure_note(result: TrialResult) -> str:
    """Adaptive measurement: how many steps were timed, when fewer than the most."""
    if result.measure_stop in ("", "full window"):
        return ""
    steps = len(result.step_times_s)
    return f"; timed {steps} step{'s' if steps != 1 else ''}: {result.measure_stop}"


def trial_line(
    number: int, candidate: Candidate, result: TrialResult, device_kind: str = DeviceKind.CPU
) -> str:
    figures = ""
    if result.samples_per_s is not None:
        figures = f" {result.samples_per_s:8.2f} samples/s"
    if result.peak_memory_bytes is not None:
        figures += f"  peak {format_size(result.peak_memory_bytes)}"
    note = result.reason + short_step_note(result, device_kind) + measure_note(result)
    if result.reused_from:
        note = f"reused: {result.reused_from} measured it; " + note
    note = note.strip("; ")
    reason = f"  ({note})" if note else ""
    return f"trial {number:>3} {result.outcome.value:<8} {candidate.describe()}{figures}{reason}"


LONG_SEARCH_S = 30 * 60


def time_left(
    walls: list[float], done: int, limits: SearchLimits, deadline_left: float | None
) -> float | None:
    """Seconds the search likely still takes: the mean probe's wall time for each probe
    --max-trials still allows, plus the confirmations (two runs per finalist, longer),
    never past the time budget. None before the first probe."""
    if not walls:
        return None
    mean = sum(walls) / len(walls)
    confirm = 2 * limits.confirm_top * mean * 1.5
    predicted = mean * max(0, limits.max_trials - done) + confirm
    return predicted if deadline_left is None else min(predicted, deadline_left)


@dataclasses.dataclass
class Pace:
    """How far a search is and how long it has left, from its probes' wall times."""

    limits: SearchLimits = dataclasses.field(default_factory=SearchLimits)
    deadline: Deadline | None = None
    done: int = 0  # probes in the study (earlier runs included)
    walls: list[float] = dataclasses.field(default_factory=list)

    def probed(self, wall: float) -> str:
        """Count a probe that ran; after the first, a note when the search will be long."""
        self.done += 1
        self.walls.append(wall)
        left = self.left()
        if len(self.walls) > 1 or left is None or left <= LONG_SEARCH_S:
            return ""
        return (
            f"note: at {format_duration(wall)} a probe, this search will take "
            f"about {format_duration(left)} more; --time-budget, a smaller --max-trials, "
            "--confirm-top 0 or fewer --precisions/--optimizers shorten it"
        )

    def left(self) -> float | None:
        deadline_left = self.deadline.left() if self.deadline else None
        return time_left(self.walls, self.done, self.limits, deadline_left)

    def count(self) -> str:
        left = self.left()
        eta = f", about {format_duration(left)} left" if left is not None else ""
        return f"probe {self.done + 1} of {self.limits.max_trials}{eta}"


class Progress:
    """Observer of a search. `live=False` (or no terminal) prints one line per trial."""

    def __init__(
        self,
        console: Console,
        *,
        live: bool,
        deadline: Deadline | None = None,
        notes: list[str] | None = None,
    ) -> None:
        self.notes = notes or []  # what the search took from a default, said first
        self.console = console
        self.deadline = deadline
        self.live_enabled = live and console.is_terminal
        self.rows: list[tuple[int, Candidate, TrialResult]] = []
        self.running: tuple[int, Candidate] | None = None
        self.started = time.monotonic()
        self.live: Live | None = None
        self.budget = 0
        self.kind: str = DeviceKind.CPU
        self.pace = Pace(deadline=deadline)

    def on_search_start(
        self, spec: SearchSpec, study_name: str, limits: SearchLimits, done: int = 0
    ) -> None:
        self.pace = Pace(limits, self.deadline, done)
        self.started = time.monotonic()
        self.budget = spec.fit_limit_bytes
        self.kind = spec.device.kind
        self._say(f"study {study_name}: {spec.describe()}")
        for line in [*data_lines(spec), *self.notes]:
            self._say(line)
        if self.live_enabled:
            self.live = Live(self._table(), console=self.console, refresh_per_second=2)
            self.live.start()

    def on_trial_start(self, number: int, candidate: Candidate) -> None:
        self.running = (number, candidate)
        self._refresh()
        if not self.live:
            self._say(
                f"trial {number:>3} running  {candidate.describe()}  ({self.pace.count()})",
                soft_wrap=True,
            )

    def on_trial_end(self, number: int, candidate: Candidate, result: TrialResult) -> None:
        self.running = None
        self.rows.append((number, candidate, result))
        if result.outcome != Outcome.SKIPPED and not result.reused_from:
            note = self.pace.probed(result.phases_s.get("wall", 0.0))
            if note:
                self._say(note)
        self._refresh()
        if not self.live:
            self._say(trial_line(number, candidate, result, self.kind), soft_wrap=True)

    def on_confirm(self, number: int, candidate: Candidate, result: TrialResult) -> None:
        line = trial_line(number, candidate, result, self.kind).replace("trial", "confirm", 1)
        self._say(line, soft_wrap=True)

    def on_parity_start(self, label: str, candidate: Candidate) -> None:
        role = _PARITY_ROLES.get(label, "a finalist's arithmetic")
        self._say(f"parity  {label:<10} {candidate.describe()}  ({role})", soft_wrap=True)

    def on_parity_reused(self, study: str, runs: list[str]) -> None:
        self._say(f"parity  reused: study {study}'s runs ({', '.join(runs)})", soft_wrap=True)

    def on_parity(self, candidate: Candidate, parity: Parity) -> None:
        self._say(
            f"parity  {candidate.precision} {candidate.optim}: {parity.figures()}", soft_wrap=True
        )

    def on_plan(self, line: str) -> None:
        """What the time budget planned once the first config was measured."""
        self._say(line, soft_wrap=True)

    def close(self) -> None:
        """Stop the live display (also when the search ends by an exception)."""
        if self.live:
            self.live.update(self._table())
            self.live.stop()
            self.live = None

    def on_search_end(self, report: SearchReport) -> None:
        self.close()
        self._say(
            f"stopped: {report.stop_reason}; {report.probes_this_run} probe(s) this run, "
            f"{len(report.records)} trial(s) in the study, {format_duration(report.elapsed_s)}"
        )

    def _say(self, text: str, *, soft_wrap: bool | None = None) -> None:
        """A line as it reads: a reason may hold brackets (a path, torch's '[enforce fail
        at ...]') that rich would take as markup, dropping them or failing on '[/tmp...]'."""
        self.console.print(text, markup=False, soft_wrap=soft_wrap)

    def _refresh(self) -> None:
        if self.live:
            self.live.update(self._table())

    def _table(self) -> Table:
        elapsed = time.monotonic() - self.started
        remaining = self.deadline.left() if self.deadline else None
        left = f", {format_duration(remaining)} left" if remaining is not None else ""
        best = max(
            (
                r.samples_per_s or 0.0
                for _, _, r in self.rows
                if r.outcome == Outcome.OK and (r.peak_memory_bytes or 0) <= self.budget
            ),
            default=None,
        )
        title = f"{self.pace.count()}; elapsed {format_duration(elapsed)}{left}" + (
            f"; best {best:.2f} samples/s" if best else ""
        )
        table = Table(title=title)
        for column in ("trial", "config", "outcome", "samples/s", "peak", "note"):
            table.add_column(column)
        for number, candidate, result in self.rows[-15:]:
            table.add_row(
                str(number),
                candidate.describe(),
                Text(result.outcome.value, _STYLE[result.outcome]),
                f"{result.samples_per_s:.2f}" if result.samples_per_s else "",
                format_size(result.peak_memory_bytes) if result.peak_memory_bytes else "",
                Text(result.reason[:40]),  # plain: brackets in it are not markup
            )
        if self.running:
            table.add_row(str(self.running[0]), self.running[1].describe(), "running…", "", "", "")
        return table
