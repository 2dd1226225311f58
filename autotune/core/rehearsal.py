"""The rehearsal of a run's memory events: what the user's run does besides training
steps, run once under the same memory limit before a config is exported.

A probe measures training steps. The user's run also evaluates (with `compute_metrics`
the Trainer keeps every batch's logits until `eval_accumulation_steps`), saves
checkpoints (the optimizer state too; under ZeRO-3 the full weights gathered) and may
resume from one. The rehearsal trains a step (so the optimizer state is held, as at the
run's first evaluation), evaluates, saves and resumes, each an event whose peak is
recorded; an out-of-memory names the event it happened in. The child writes each
event's start and end to `EVENTS_NAME` as it goes, so an event that killed the process
is named too.

Pure: the child (probe/_rehearse.py) writes the events, the parent (tuning/rehearsal.py)
plans the runs and tunes the evaluation batch.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from autotune.core._typed import check_fields
from autotune.core.files import parse_json

EVENTS_NAME = "rehearsal.jsonl"
EVENTS = ("train", "evaluation", "save", "resume")


@dataclasses.dataclass(frozen=True)
class Event:
    """One event of a rehearsal: how it ended and the process's peak after it."""

    name: str
    # "ok", "oom", "error", "skipped" (with why), "not reached", "cut" (the trial's time
    # limit ended while it ran, `reason` says which: neither a fit nor out of memory)
    outcome: str
    peak_bytes: int | None = None
    reason: str = ""
    done: float | None = None  # the evaluation: the share of its batches done (a failure)
    # the evaluation: the peak its pass would end at, its peak's growth with the batches
    # done (its progress marks) carried to the end, or what it held at its start and the
    # logits kept of each sample times its samples: what no smaller batch lowers
    pass_end_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class Rehearsal:
    """A config's rehearsal: its events, and the evaluation settings it ran with (the
    tuned ones, where the user's did not fit)."""

    events: tuple[Event, ...]
    eval_batch: int | None = None  # per_device_eval_batch_size it evaluated with
    eval_accumulation: int | None = None  # eval_accumulation_steps it evaluated with
    tuned: bool = False  # the evaluation settings are not the user's: exported with it
    # the evaluation does not fit at any evaluation batch: no config's would
    hopeless: bool = False
    note: str = ""  # what was tried, or what would fit when nothing did
    # not run, as its bound shows it fits: what the run's save and resume add at most
    # (the whole checkpoint) beside the training's measured peak is within the budget
    unneeded: str = ""
    # how long its last child ran (the one at the evaluation settings it reports): what
    # the rehearsal of the config to export is planned at
    seconds: float | None = None

    @property
    def failed(self) -> Event | None:
        return next((e for e in self.events if e.outcome in ("oom", "error")), None)

    @property
    def blocks_export(self) -> bool:
        """An event ran out of memory: the config is not exported. Another failure (an
        error in the user's metric, a timeout) is the job's, not the config's: said."""
        failed = self.failed
        return failed is not None and failed.outcome == "oom"

    @property
    def cut(self) -> Event | None:
        """The event its time limit ended in (the rest not reached)."""
        return next((e for e in self.events if e.outcome == "cut"), None)

    @property
    def passed(self) -> bool:
        return (
            self.failed is None and self.cut is None and any(e.outcome == "ok" for e in self.events)
        )

    @property
    def clears(self) -> bool:
        """Whether the config may be exported: it fits every event, or needs no rehearsal."""
        return self.passed or bool(self.unneeded)

    @property
    def job_level(self) -> bool:
        """A failure no training config changes: the kept logits piling up whatever the
        evaluation batch, an event that raised, or one that outran the trial's limit."""
        failed = self.failed
        error = failed is not None and failed.outcome == "error"
        return self.hopeless or error or self.cut is not None

    def fix(self) -> str:
        """What would change a job-level failure ("" for any other)."""
        if self.hopeless or not self.job_level:
            return ""  # the note says what would fit
        if self.cut is not None:
            return (
                "raise --trial-timeout (one pass over your evaluation set is rehearsed), or "
                "evaluate on fewer samples"
            )
        return (
            "your own run would fail there too: fix it (the rehearsal's log is in the "
            "study's trials/ folder), or pass --no-rehearse to search without it"
        )

    def exported_fields(self) -> dict[str, Any]:
        """The evaluation settings it tuned (the user's did not fit), exported with the
        config; {} where theirs fit or it did not pass."""
        if not self.tuned or not self.passed:
            return {}
        tuned: dict[str, Any] = {"per_device_eval_batch_size": self.eval_batch}
        if self.eval_accumulation is not None:
            tuned["eval_accumulation_steps"] = self.eval_accumulation
        return tuned

    def describe(self) -> str:
        """One line: what ran and its peaks, or which event failed at what peak."""
        failed = self.failed
        if self.unneeded:
            line = f"rehearsal: not needed: {self.unneeded}"
        elif failed is not None:
            peak = f" at a peak of {_gib(failed.peak_bytes)}" if failed.peak_bytes else ""
            what = "out of memory" if failed.outcome == "oom" else f"failed ({failed.reason})"
            through = f", {failed.done:.0%} of the way through" if failed.done else ""
            line = f"rehearsal: {what} at {failed.name}{peak}{through}"
        elif (cut := self.cut) is not None:
            fit = [f"{e.name} {_gib(e.peak_bytes)}" for e in self.events if e.outcome == "ok"]
            before = f" ({'; '.join(fit)} fit)" if fit else ""
            by = f" by {cut.reason}" if cut.reason else ""
            line = f"rehearsal: cut at {cut.name}{by}{before}"
        else:
            parts = [
                f"{e.name} {_gib(e.peak_bytes)}" if e.outcome == "ok" else f"{e.name} {e.reason}"
                for e in self.events
                if e.outcome != "not reached"
            ]
            line = "rehearsal: fits (" + "; ".join(parts) + ")"
        return line + (f"; {self.note}" if self.note else "")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Rehearsal:
        """ValueError saying what is wrong on anything not a rehearsal of this version."""
        raw = check_fields(cls, parse_json(text))
        events = tuple(Event(**check_fields(Event, e)) for e in raw.pop("events"))
        return cls(events=events, **raw)


def read_events(
    text: str, *, failure: str, peak_bytes: int | None = None, reason: str = ""
) -> tuple[Event, ...]:
    """The events the child wrote (a JSON object a line: `{"event", "state", ...}`). An
    event started and never ended is the one the process failed in, as `failure` says
    ("oom" or "error": how the run ended; "cut": its time limit ended it), at the
    process's `peak_bytes` (read after it failed; else the peak when the event started).
    Where an evaluation failed, the peak its pass would end at: its progress marks'
    growth carried to the end (`pass_end`), or, where more, what it held at its start
    and the logits it keeps of each sample times its samples (a floor: lines "kept")."""
    started: dict[str, dict[str, Any]] = {}
    done: dict[str, Event] = {}
    progress: dict[str, list[tuple[float, int]]] = {}
    kept: dict[str, int] = {}  # an event's floor: what it holds at its start + all it keeps
    for line in text.splitlines():
        try:
            raw = parse_json(line)
        except ValueError:
            continue  # a line cut short by the process dying
        if not isinstance(raw, dict):
            continue  # no event: the child writes none such
        name, state = str(raw.get("event", "")), raw.get("state")
        if state == "start":
            started[name] = raw
        elif state == "progress":
            mark = (_share(raw.get("done")), _count(raw.get("peak_bytes")) or 0)
            progress.setdefault(name, []).append(mark)
        elif state == "kept" and name in started:
            held = _count(started[name].get("held_bytes")) or 0
            each = _count(raw.get("bytes_per_sample")) or 0
            kept[name] = held + each * (_count(raw.get("samples")) or 0) if held else 0
        elif state == "end":
            done[name] = Event(name, "ok", _count(raw.get("peak_bytes")))
        elif state == "skipped":
            done[name] = Event(name, "skipped", reason=_line(raw.get("reason")))
        elif state in ("oom", "error"):
            done[name] = Event(name, state, _count(raw.get("peak_bytes")), _line(raw.get("reason")))
    events = []
    for name in EVENTS:
        if name in done:
            events.append(done[name])
        elif name in started:
            peak = peak_bytes or _count(started[name].get("peak_bytes"))
            why = "" if failure == "oom" else reason
            marks = progress.get(name, [])
            done_share = marks[-1][0] if marks else 0.0
            end = max(pass_end(marks) or 0, kept.get(name, 0)) or None
            events.append(Event(name, failure, peak, why, done_share, end))
        else:
            events.append(Event(name, "not reached"))
    return tuple(events)


def _count(value: Any) -> int | None:
    """A count of bytes or samples as the child wrote it; None where it wrote no count
    (a line another version, or a damaged file, holds), or none a machine could have."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if 0 <= value < 2**63 else None  # NaN compares False


def _share(value: Any) -> float:
    """The share of a pass done, from 0 to 1 (0 where the line says no number)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return 0.0
    return float(min(max(value, 0), 1))


def _line(value: Any) -> str:
    """A reason as one line ("" where there is none)."""
    lines = str(value).strip().splitlines() if value is not None else []
    return lines[0][:300] if lines else ""


def pass_end(marks: list[tuple[float, int]]) -> int | None:
    """The peak an evaluation pass ends at, from its progress marks (share done, peak):
    the line through its first and last marks, carried to the whole pass (None without
    two marks that grew). The first mark, not the start, anchors it: the start's peak is
    the training's, which the kept logits overtake only after a while. Where the run
    evaluates several sets (a dict of them), each its own pass, the last pass's marks."""
    starts = [i for i in range(1, len(marks)) if marks[i][0] <= marks[i - 1][0]]
    marks = marks[starts[-1] :] if starts else marks
    if len(marks) < 2:
        return None
    (first_done, first_peak), (last_done, last_peak) = marks[0], marks[-1]
    if last_done <= first_done or last_peak <= first_peak:
        return None
    slope = (last_peak - first_peak) / (last_done - first_done)
    return round(last_peak + slope * (1.0 - last_done))


def _gib(value: int | None) -> str:
    return f"{(value or 0) / 2**30:.2f} GiB"
