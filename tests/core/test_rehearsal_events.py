"""The rehearsal's events as the child writes them and the user reads them."""

from __future__ import annotations

import dataclasses
import json

from autotune.core.rehearsal import Event, Rehearsal, pass_end, read_events

GIB = 2**30
MIB = 2**20


def lines(*raw: dict[str, object]) -> str:
    return "\n".join(json.dumps(r) for r in raw)


def test_the_event_started_and_never_ended_is_the_one_that_failed() -> None:
    text = (
        lines(
            {"logits_kept": True},
            {"event": "train", "state": "start", "peak_bytes": GIB},
            {"event": "train", "state": "end", "peak_bytes": GIB},
            {"event": "evaluation", "state": "start", "peak_bytes": 2 * GIB},
        )
        + '\n{"event": "evaluation", "sta'
    )  # a line cut short as the process died
    events = read_events(text, failure="oom")
    assert [(e.name, e.outcome) for e in events] == [
        ("train", "ok"),
        ("evaluation", "oom"),
        ("save", "not reached"),
        ("resume", "not reached"),
    ]
    found = Rehearsal(events)
    assert found.failed == Event("evaluation", "oom", 2 * GIB, done=0.0) and not found.passed
    assert found.describe() == "rehearsal: out of memory at evaluation at a peak of 2.00 GiB"
    # the peak read after the process failed, and how far the evaluation had got
    late = text + "\n" + lines({"event": "evaluation", "state": "progress", "done": 0.7})
    failed = Rehearsal(read_events(late, failure="oom", peak_bytes=3 * GIB)).failed
    assert failed == Event("evaluation", "oom", 3 * GIB, done=0.7)
    assert Rehearsal((failed,)).describe().endswith("at a peak of 3.00 GiB, 70% of the way through")


def test_a_rehearsal_that_fits_says_each_events_peak_and_what_it_skipped() -> None:
    text = lines(
        {"event": "evaluation", "state": "skipped", "reason": "your job has no evaluation dataset"},
        {"event": "train", "state": "start", "peak_bytes": GIB},
        {"event": "train", "state": "end", "peak_bytes": GIB},
        {"event": "save", "state": "start", "peak_bytes": GIB},
        {"event": "save", "state": "end", "peak_bytes": GIB + GIB // 2},
        {"event": "resume", "state": "start", "peak_bytes": GIB + GIB // 2},
        {"event": "resume", "state": "end", "peak_bytes": 2 * GIB},
    )
    found = Rehearsal(read_events(text, failure="error"), eval_batch=16, tuned=True)
    assert found.passed
    assert found.describe() == (
        "rehearsal: fits (train 1.00 GiB; evaluation your job has no evaluation dataset; "
        "save 1.50 GiB; resume 2.00 GiB)"
    )
    assert Rehearsal.from_json(found.to_json()) == found


def test_only_running_out_of_memory_rules_a_config_out_an_error_is_the_jobs() -> None:
    """Running out of memory is the config's: the next is rehearsed. An error in the
    user's metric is the job's, the same for every config: no other config is tried, the
    search stops with it and says what to do."""
    from helpers import cand, rec

    from autotune.tuning.selection import exportable

    oom = Rehearsal((Event("train", "ok", GIB), Event("evaluation", "oom", 2 * GIB)))
    error = Rehearsal((Event("train", "ok", GIB), Event("evaluation", "error", GIB, "KeyError")))
    assert oom.blocks_export and not error.blocks_export and not error.passed
    assert "failed (KeyError) at evaluation" in error.describe()
    assert error.job_level and not oom.job_level and "--no-rehearse" in error.fix()
    assert not exportable(dataclasses.replace(rec(0, cand(8)), rehearsal=oom))
    assert exportable(dataclasses.replace(rec(0, cand(8)), rehearsal=error))


def test_an_evaluations_progress_marks_say_where_its_pass_would_end() -> None:
    """The kept logits grow with the batches done: the line through the first and last
    marks, carried to the whole pass (the start's peak is the training's, flat until the
    logits overtake it). One mark, or none that grew, says nothing."""
    marks = [(0.1, 700 * MIB), (0.2, 800 * MIB), (0.4, 1000 * MIB)]
    assert pass_end(marks) == 1600 * MIB
    assert pass_end(marks[:1]) is None and pass_end([(0.1, GIB), (0.2, GIB)]) is None
    # a second evaluation set is a pass of its own: its marks alone
    assert pass_end([(0.5, GIB), (1.0, 2 * GIB), *marks]) == 1600 * MIB
    text = lines(
        {"event": "train", "state": "start", "peak_bytes": GIB // 2},
        {"event": "train", "state": "end", "peak_bytes": GIB // 2},
        {"event": "evaluation", "state": "start", "peak_bytes": GIB // 2},
        *(
            {"event": "evaluation", "state": "progress", "done": d, "peak_bytes": b}
            for d, b in marks
        ),
    )
    failed = Rehearsal(read_events(text, failure="oom", peak_bytes=GIB)).failed
    assert failed == Event("evaluation", "oom", GIB, done=0.4, pass_end_bytes=1600 * MIB)


def test_the_logits_kept_of_each_sample_set_a_floor_on_the_passs_end() -> None:
    """A pass that died at its first tenth says nothing by its marks; but it held 1 GiB
    when it started and keeps 4 MiB of logits a sample for 512 samples: it would end at
    3 GiB at least, whatever the batch. Without what it held at its start, no floor."""
    text = lines(
        {"event": "train", "state": "end", "peak_bytes": 2 * GIB},
        {"event": "evaluation", "state": "start", "peak_bytes": 2 * GIB, "held_bytes": GIB},
        {"event": "evaluation", "state": "kept", "bytes_per_sample": 2 * MIB, "samples": 512},
        {"event": "evaluation", "state": "kept", "bytes_per_sample": 4 * MIB, "samples": 512},
        {"event": "evaluation", "state": "progress", "done": 0.1, "peak_bytes": 2 * GIB},
    )
    failed = Rehearsal(read_events(text, failure="oom", peak_bytes=2 * GIB)).failed
    assert failed is not None and failed.pass_end_bytes == 3 * GIB
    unheld = text.replace(', "held_bytes": 1073741824', "")
    assert Rehearsal(read_events(unheld, failure="oom")).failed.pass_end_bytes is None  # type: ignore[union-attr]
