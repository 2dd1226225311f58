"""The rehearsal's events file (`rehearsal.jsonl`), which the child appends to as it goes
and the parent reads back, with bad content, generated: whatever a line holds, the
events read are the four the rehearsal knows, each with a count or none, and the line
that says them is one line; never a traceback."""

from __future__ import annotations

import json

import pytest
from bad_files import JSON_VALUES, bad_content, examples, one_line
from hypothesis import given
from hypothesis import strategies as st

from autotune.core.rehearsal import EVENTS, Event, Rehearsal, read_events
from autotune.tuning.rehearsal import _logits_kept

GIB = 2**30
GOOD_LINES = [
    {"logits_kept": True},
    {"event": "train", "state": "start", "peak_bytes": GIB},
    {"event": "train", "state": "end", "peak_bytes": GIB},
    {"event": "evaluation", "state": "start", "peak_bytes": 2 * GIB, "held_bytes": GIB},
    {"event": "evaluation", "state": "progress", "done": 0.5, "peak_bytes": 2 * GIB},
    {"event": "evaluation", "state": "kept", "bytes_per_sample": 1000, "samples": 64},
    {"event": "evaluation", "state": "oom", "peak_bytes": 3 * GIB, "reason": "out of memory"},
    {"event": "save", "state": "skipped", "reason": "no checkpoint saving"},
]
STATES = ["start", "progress", "kept", "end", "skipped", "oom", "error", None]
# a line as the child writes it, with any value in any of its fields
EVENT_LINES = st.fixed_dictionaries(
    {"event": st.sampled_from([*EVENTS, "other"]), "state": st.sampled_from(STATES)},
    optional={
        k: JSON_VALUES
        for k in ("peak_bytes", "held_bytes", "done", "bytes_per_sample", "samples", "reason")
    },
).map(lambda line: json.dumps(line).encode())
LINES = st.lists(
    st.one_of(EVENT_LINES, *(bad_content(line) for line in GOOD_LINES[1:4])), max_size=10
).map(b"\n".join)


def _checked(events: tuple[Event, ...]) -> None:
    assert [e.name for e in events] == list(EVENTS)
    for e in events:
        assert e.outcome in ("ok", "oom", "error", "skipped", "not reached", "cut")
        for count in (e.peak_bytes, e.pass_end_bytes):
            assert count is None or (type(count) is int and count >= 0)
        assert e.done is None or 0.0 <= e.done <= 1.0
        assert isinstance(e.reason, str) and "\n" not in e.reason
    rehearsal = Rehearsal(events)
    assert one_line(rehearsal.describe())
    assert Rehearsal.from_json(rehearsal.to_json()) == rehearsal


@examples(120)
@given(text=LINES, failure=st.sampled_from(["oom", "error", "cut"]))
def test_an_events_file_of_any_lines_reads_as_the_four_events(text: bytes, failure: str) -> None:
    decoded = text.decode("utf-8", errors="replace")
    _checked(read_events(decoded, failure=failure, peak_bytes=None, reason="exit code 1"))
    assert isinstance(_logits_kept(decoded), bool)


@examples(100)
@given(content=bad_content())
def test_an_events_file_of_junk_reads_as_nothing_reached(content: bytes) -> None:
    decoded = content.decode("utf-8", errors="replace")
    _checked(read_events(decoded, failure="oom"))
    assert isinstance(_logits_kept(decoded), bool)


@pytest.mark.parametrize(
    ("line", "outcome"),
    [
        # found by the generated cases: AttributeError, ValueError, OverflowError
        ([1, 2], ("train", "not reached", None)),
        ({"event": "train", "state": "end", "peak_bytes": "1 GiB"}, ("train", "ok", None)),
        ({"event": "train", "state": "end", "peak_bytes": 1e400}, ("train", "ok", None)),
        ({"event": "train", "state": "oom", "peak_bytes": -1}, ("train", "oom", None)),
        ({"event": "train", "state": "end", "peak_bytes": 10**30}, ("train", "ok", None)),
    ],
    ids=["list", "text", "infinite", "negative", "huge"],
)
def test_an_event_line_of_the_wrong_types_reads_as_no_figure(
    line: object, outcome: tuple[str, str, int | None]
) -> None:
    (first, *_) = read_events(json.dumps(line), failure="oom")
    assert (first.name, first.outcome, first.peak_bytes) == outcome
    assert one_line(Rehearsal((first,)).describe())


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"event": "evaluation", "state": "progress", "done": "half"}),
        json.dumps({"event": "evaluation", "state": "progress", "done": None}),
        '{"event": "evaluation", "state": "start"}\n' + "[" * 5000 + "]" * 5000,
        '{"peak_bytes": ' + "9" * 5000 + "}",
        "[1]",  # _logits_kept: a list has no .get
    ],
    ids=["text-share", "null-share", "deep", "long", "list"],
)
def test_lines_that_raised_before_are_skipped(text: str) -> None:
    """Found by the generated cases: float('half'), float(None), RecursionError, int()'s
    digit limit and [].get raised out of the parent's reading."""
    _checked(read_events(text, failure="oom"))
    assert _logits_kept(text) is False
