"""Checks first: no config is exported unrehearsed where the run evaluates or saves, the
rehearsal runs past the time budget rather than be skipped (and says by how much), and a
failure no config can fix is found by the first config that fits and stops the search.

The rehearsal's children are faked here (their events written as a real child writes
them); tests/tuning/test_rehearsal.py runs real ones."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from typing import Any

import pytest
from helpers import SPEC, cand, rec

from autotune.core.enums import Objective, Outcome
from autotune.core.errors import NoFitError
from autotune.core.rehearsal import EVENTS_NAME, Event, Rehearsal
from autotune.core.trial import TrialRecord, TrialResult
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.tuning.rehearsal import (
    job_failure,
    rehearse_first,
    rehearse_selected,
    reserved_s,
)
from autotune.tuning.selection import nothing_fits, select_export

GIB = 2**30
EVALUATES = dataclasses.replace(
    SPEC,
    base_arguments={"eval_strategy": "steps", "per_device_eval_batch_size": 64},
    memory_budget_bytes=2 * GIB,
)
PASSED = Rehearsal((Event("train", "ok", GIB), Event("evaluation", "ok", GIB)), seconds=12.0)


class Store:
    """The study as the rehearsal reads and writes it."""

    def __init__(self, records: list[TrialRecord]) -> None:
        self.recs = records
        self.settings = self  # the study's attributes: its rehearsals

    def records(self) -> list[TrialRecord]:
        return list(self.recs)

    def save_rehearsal(self, number: int, found: Rehearsal) -> None:
        self.recs = [
            dataclasses.replace(r, rehearsal=found) if r.number == number else r for r in self.recs
        ]


@dataclasses.dataclass(frozen=True)
class _Config:
    trial_dir: str
    number: int = 0
    rehearsal: dict[str, Any] | None = None


def _run(
    tmp_path: Path,
    records: list[TrialRecord],
    *,
    fits_from: int = 64,
    pile: bool = False,
    error: str = "",
    clock: list[float] | None = None,
) -> types.SimpleNamespace:
    """A search run whose rehearsal children evaluate at batches up to `fits_from`
    (larger ones run out of memory early in the pass; with `pile`, every batch runs out
    late, its logits growing past the limit), or raise `error` in the evaluation; each
    child moves the fake `clock` on 20 s."""
    said: list[str] = []
    batches: list[tuple[int, int]] = []
    limit = EVALUATES.fit_limit_bytes

    def launched(config: _Config, timeout_s: float) -> TrialResult:
        batch = int(config.rehearsal["fields"]["per_device_eval_batch_size"])  # type: ignore[index]
        batches.append((config.number, batch))
        if clock is not None:
            clock[0] += 20.0
        lines: list[dict[str, Any]] = [
            {"logits_kept": True},
            {"event": "train", "state": "end", "peak_bytes": GIB},
            {"event": "evaluation", "state": "start", "peak_bytes": GIB},
        ]
        outcome, reason = Outcome.OK, ""
        if error:
            lines.append({"event": "evaluation", "state": "error", "reason": error})
            outcome, reason = Outcome.ERROR, error
        elif pile:  # 0.6 of the limit more at each tenth: over it at 0.5 of the pass
            for tenth in range(1, 5):
                peak = int(limit * (0.5 + 0.12 * tenth))
                lines.append(
                    {
                        "event": "evaluation",
                        "state": "progress",
                        "done": tenth / 10,
                        "peak_bytes": peak,
                    }
                )
            outcome = Outcome.OOM
        elif batch > fits_from:
            outcome = Outcome.OOM
        else:
            lines.append({"event": "evaluation", "state": "end", "peak_bytes": GIB})
        (Path(config.trial_dir) / EVENTS_NAME).write_text(
            "".join(json.dumps(line) + "\n" for line in lines)
        )
        return TrialResult(outcome, reason=reason, peak_memory_bytes=limit, phases_s={"wall": 20.0})

    return types.SimpleNamespace(
        spec=EVALUATES,
        store=Store(records),
        limits=SearchLimits(rehearse=True),
        observer=types.SimpleNamespace(on_plan=said.append),
        launcher=types.SimpleNamespace(run=launched),
        trial_config=lambda number, *args, **kwargs: _Config(str(tmp_path), number),
        said=said,
        batches=batches,
    )


def _timed(record: TrialRecord, wall: float = 30.0) -> TrialRecord:
    result = dataclasses.replace(record.result, phases_s={"wall": wall})
    return dataclasses.replace(record, result=result)


def test_the_config_to_export_rehearses_past_the_budget_and_says_by_how_much(
    tmp_path: Path,
) -> None:
    """5 s of the budget left and a rehearsal of about a minute: it runs (the budget once
    skipped it, and the export died at the user's first evaluation), said before, and
    its line says how far past the budget it ended."""
    now = [0.0]
    run = _run(tmp_path, [_timed(rec(0, cand(8)))], clock=now)
    rehearse_selected(run, Deadline(5.0, clock=lambda: now[0]))  # type: ignore[arg-type]
    assert run.batches == [(0, 64)]
    assert "it runs past the budget (no config is exported unrehearsed)" in run.said[0]
    assert run.said[1].startswith("trial 0: rehearsal: fits (train 1.00 GiB")
    assert run.said[1].endswith("(15s past the time budget)")
    (record,) = run.store.records()
    assert record.rehearsal is not None and record.rehearsal.passed


def test_logits_that_pile_up_whatever_the_batch_raise_with_the_fix_last(tmp_path: Path) -> None:
    run = _run(tmp_path, [_timed(rec(0, cand(8)))], pile=True)
    with pytest.raises(NoFitError) as raised:
        rehearse_selected(run, Deadline(None))  # type: ignore[arg-type]
    message = str(raised.value)
    assert message.startswith("trial 0 trains within the budget, but its rehearsal: out of")
    assert message.endswith("(preprocess_logits_for_metrics, e.g. an argmax)")
    assert run.batches == [(0, 64)]  # the pass's growth ends the halving at once


def test_an_evaluation_that_raises_is_the_jobs_failure_and_stops_the_search(
    tmp_path: Path,
) -> None:
    """Their metric raises: every config's evaluation would, so nothing is exported and
    the error says where to look; it is not taken for a config that does not fit."""
    run = _run(tmp_path, [_timed(rec(0, cand(8))), _timed(rec(1, cand(16)))], error="KeyError")
    with pytest.raises(NoFitError, match=r"failed \(KeyError\) at evaluation.*--no-rehearse"):
        rehearse_selected(run, Deadline(None))  # type: ignore[arg-type]
    assert len(run.batches) == 1
    assert job_failure(run.store.records()) is not None
    # where another config's rehearsal passed, the failure was that config's, not the job's
    passed = dataclasses.replace(rec(2, cand(32)), rehearsal=PASSED)
    assert job_failure([*run.store.records(), passed]) is None


def test_the_first_config_that_fits_rehearses_at_once_where_the_run_evaluates(
    tmp_path: Path,
) -> None:
    """Once: a study that holds a rehearsal does not run another while exploring; nor
    does a run that only saves (its rehearsal waits for the config to export), nor a
    search told --no-rehearse."""
    records = [rec(0, cand(8), Outcome.OOM), _timed(rec(1, cand(16)))]
    run = _run(tmp_path, records, fits_from=32)
    assert rehearse_first(run, run.store.records(), Deadline(None))  # type: ignore[arg-type]
    assert run.batches == [(1, 64), (1, 32)]
    assert "trial 1, the first config that fits, runs your evaluation now" in run.said[0]
    assert not rehearse_first(run, run.store.records(), Deadline(None))  # type: ignore[arg-type]
    saving = types.SimpleNamespace(**{**vars(run), "spec": SPEC, "store": Store(records)})
    assert not rehearse_first(saving, records, Deadline(None))  # type: ignore[arg-type]
    off = types.SimpleNamespace(**{**vars(run), "limits": SearchLimits(), "store": Store(records)})
    assert not rehearse_first(off, records, Deadline(None))  # type: ignore[arg-type]


def test_later_rehearsals_start_at_the_evaluation_batch_found_to_fit(tmp_path: Path) -> None:
    """Trial 1's rehearsal found 32 fits where their 64 did not; trial 2, faster, is to be
    exported: its rehearsal starts at 32, exported with it, not at the 64 seen to fail."""
    found = dataclasses.replace(PASSED, eval_batch=32, tuned=True)
    first = dataclasses.replace(_timed(rec(1, cand(16))), rehearsal=found)
    run = _run(tmp_path, [first, _timed(rec(2, cand(32), sps=20.0))], fits_from=32)
    rehearse_selected(run, Deadline(None))  # type: ignore[arg-type]
    assert run.batches == [(2, 32)]
    chosen = select_export(EVALUATES, run.store.records())
    assert chosen is not None and chosen.number == 2 and chosen.rehearsal is not None
    assert chosen.rehearsal.exported_fields() == {"per_device_eval_batch_size": 32}
    assert "found to fit by trial 1's rehearsal" in chosen.rehearsal.note


@pytest.mark.parametrize("objective", list(Objective))
@pytest.mark.parametrize("train_steps", [0, 1000])
def test_every_objective_exports_through_the_same_gate(
    objective: Objective, train_steps: int
) -> None:
    """Throughput, efficiency and the time to finish the user's run alike: the faster,
    leaner config unrehearsed is not the export; the rehearsed one is."""
    spec = dataclasses.replace(EVALUATES, train_steps=train_steps)
    slow = dataclasses.replace(rec(0, cand(8), sps=10.0, peak_gib=1.5), rehearsal=PASSED)
    fast = rec(1, cand(16), sps=20.0, peak_gib=1.0)
    chosen = select_export(spec, [slow, fast], objective)
    assert chosen is not None and chosen.number == 0


def test_no_config_is_exported_unrehearsed_where_the_run_evaluates_or_saves() -> None:
    """The faster config was never rehearsed: the export is the slower one that passed;
    with none rehearsed, nothing, and the error says how to rehearse. --no-rehearse, or a
    run that neither evaluates nor saves, exports the fastest."""
    slow = dataclasses.replace(rec(0, cand(8), sps=10.0), rehearsal=PASSED)
    fast = rec(1, cand(16), sps=20.0)
    assert select_export(EVALUATES, [slow, fast]).number == 0  # type: ignore[union-attr]
    assert select_export(EVALUATES, [fast]) is None
    assert "run the search again (it resumes the study and rehearses it)" in str(
        nothing_fits([fast], EVALUATES)
    )
    assert select_export(EVALUATES, [slow, fast], rehearse=False).number == 1  # type: ignore[union-attr]
    neither = dataclasses.replace(SPEC, base_arguments={"save_strategy": "no"})
    assert select_export(neither, [slow, fast]).number == 1  # type: ignore[union-attr]
    unneeded = dataclasses.replace(fast, rehearsal=Rehearsal((), unneeded="it fits"))
    assert select_export(SPEC, [slow, unneeded]).number == 1  # type: ignore[union-attr]
    failed = Rehearsal((Event("train", "ok", GIB), Event("evaluation", "oom", 2 * GIB)))
    assert select_export(EVALUATES, [dataclasses.replace(fast, rehearsal=failed)]) is None


def test_the_time_kept_for_the_rehearsal_is_what_one_took_once_measured() -> None:
    """Before any rehearsal, what the first probe shows (`expected_s`); after one passed,
    its own time, at the evaluation batch later ones start from."""
    probe = _timed(rec(0, cand(8)), wall=30.0)
    planned = reserved_s([probe], EVALUATES, 0.0)
    assert planned > 30.0  # the probe's setup and a pass over evaluation data
    measured = dataclasses.replace(probe, rehearsal=PASSED)
    assert reserved_s([measured], EVALUATES, 0.0) == 12.0
