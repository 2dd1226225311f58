"""What a probe's child writes and the parent reads back, with bad content, generated:
its result.json (`read_result`), the DDP ranks' results (`merge_ranks`) and the
survey's answer (`launch/survey`). A result is taken only whole and of the declared
types, else the trial is an error that says what was wrong; never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bad_files import JSON_VALUES, bad_content, examples, one_line
from helpers import SPEC, cand
from hypothesis import given
from hypothesis import strategies as st

from autotune.core.enums import Outcome
from autotune.core.outcomes import classify_exit
from autotune.core.trial import TrialResult
from autotune.launch.runner import read_result
from autotune.launch.survey import FactoryFailed, _answer, _facts
from autotune.probe.ranks import RESULT_NAME, merge_ranks, rank_result_name
from autotune.tuning.selection import verdict
from autotune.views.progress import trial_line

GOOD = TrialResult(
    Outcome.OK,
    samples_per_s=12.5,
    step_time_median_s=0.08,
    step_times_s=(0.08, 0.081, 0.079),
    peak_memory_bytes=3 * 2**30,
    final_loss=2.5,
    phases_s={"wall": 4.2, "train": 1.0},
    versions={"torch": "2.8.0"},
    curve=((10, 2.4), (20, 2.3)),
    memory_limit_bytes=8 * 2**30,
)
GOOD_RAW = json.loads(GOOD.to_json())


def _as_parent_uses_it(result: TrialResult | None, problem: str, returncode: int) -> None:
    """The parent's next steps with what it read: classified, judged, printed, stored."""
    final = classify_exit(
        returncode=returncode,
        result=result,
        result_problem=problem,
        timed_out=False,
        limit_in_force=True,
        timeout_s=60,
    )
    verdict(final, SPEC, implied=False)
    line = trial_line(1, cand(16), final)
    assert one_line(line)
    assert TrialResult.from_json(final.to_json()) == final or final.final_loss != final.final_loss


@examples(200)
@given(content=bad_content(GOOD_RAW), returncode=st.sampled_from([0, 1]))
def test_a_result_file_is_read_whole_or_the_trial_is_an_error_saying_why(
    tmp_path: Path, content: bytes, returncode: int
) -> None:
    path = tmp_path / RESULT_NAME
    path.write_bytes(content)
    result, problem = read_result(path)
    if result is None:
        assert one_line(problem) and "result.json" in problem, problem
    else:
        assert problem == "" and isinstance(result.outcome, Outcome)
        for figure in (result.samples_per_s, result.peak_memory_bytes, result.final_loss):
            assert figure is None or isinstance(figure, int | float)
        assert all(isinstance(t, int | float) for t in result.step_times_s)
    _as_parent_uses_it(result, problem, returncode)
    assert path.read_bytes() == content


@examples(100)
@given(field=st.sampled_from(sorted(GOOD_RAW)), value=JSON_VALUES)
def test_any_value_of_any_result_field_is_taken_only_if_of_its_type(
    tmp_path: Path, field: str, value: object
) -> None:
    path = tmp_path / RESULT_NAME
    path.write_text(json.dumps({**GOOD_RAW, field: value}))
    result, problem = read_result(path)
    if result is None:
        assert problem.startswith("malformed result.json (") and field in problem, problem
    _as_parent_uses_it(result, problem, 0)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        # found by the generated cases: taken as they were, then failing far from the file
        ({**GOOD_RAW, "samples_per_s": "fast"}, "samples_per_s is 'fast', not float | None"),
        ({**GOOD_RAW, "peak_memory_bytes": [1]}, "peak_memory_bytes is [1], not int | None"),
        (
            {**GOOD_RAW, "phases_s": {"wall": None}},
            "phases_s is {'wall': None}, not dict[str, float]",
        ),
        ({**GOOD_RAW, "from_a_later_version": 1}, "unknown field 'from_a_later_version'"),
        ({"reason": "no outcome"}, "no outcome"),
        (["ok"], "['ok'] is not a JSON object"),
    ],
    ids=["text-figure", "list-peak", "null-phase", "extra-field", "no-outcome", "list"],
)
def test_a_result_of_the_wrong_shape_says_what_is_wrong(
    tmp_path: Path, raw: object, problem: str
) -> None:
    path = tmp_path / RESULT_NAME
    path.write_text(json.dumps(raw))
    assert read_result(path) == (None, f"malformed result.json ({problem})")


@pytest.mark.parametrize(
    ("field", "value"),
    [("step_times_s", [10**400]), ("samples_per_s", 10**400), ("peak_memory_bytes", 2**64)],
)
def test_a_number_no_machine_counts_is_malformed(tmp_path: Path, field: str, value: int) -> None:
    """Found by the generated cases: float() of it raised OverflowError out of the
    reading, or the division of it out of the judging."""
    path = tmp_path / RESULT_NAME
    path.write_text(json.dumps({**GOOD_RAW, field: value}))
    result, problem = read_result(path)
    assert result is None and problem.startswith(f"malformed result.json ({field} is ")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"[" * 5000 + b"]" * 5000, "nested deeper than can be read"),
        (b'{"outcome": "ok", "peak_memory_bytes": ' + b"9" * 5000 + b"}", "more digits"),
    ],
    ids=["deep", "long"],
)
def test_a_result_too_deep_or_too_long_to_parse_is_malformed(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    """Found by the generated cases: RecursionError escaped into the search."""
    path = tmp_path / RESULT_NAME
    path.write_bytes(content)
    result, said = read_result(path)
    assert result is None and problem in said


@examples(100)
@given(ranks=st.lists(st.none() | bad_content(GOOD_RAW), min_size=2, max_size=3))
def test_ranks_results_are_merged_only_from_what_reads(
    tmp_path: Path, ranks: list[bytes | None]
) -> None:
    (tmp_path / RESULT_NAME).unlink(missing_ok=True)
    for rank, content in enumerate(ranks):
        path = tmp_path / rank_result_name(rank)
        path.unlink(missing_ok=True)
        if content is not None:
            path.write_bytes(content)
    merge_ranks(tmp_path, len(ranks))
    result, problem = read_result(tmp_path / RESULT_NAME)
    readable = [read_result(tmp_path / rank_result_name(r))[0] for r in range(len(ranks))]
    if result is None:
        assert problem == "no result.json"
        assert all(r is None or r.outcome == Outcome.OK for r in readable)
    else:
        assert any(r is not None for r in readable)


FACTS = {
    "args_class": "transformers.TrainingArguments",
    "args_fields": ["output_dir"],
    "model_name": "tiny",
    "model_class": "GPT2LMHeadModel",
    "task": "causal-lm",
    "config": {"model_type": "gpt2"},
    "parameters": 1000,
    "trainable": 1000,
    "embedding": 100,
    "largest": 100,
}


@examples(150)
@given(
    content=st.none()
    | bad_content({"facts": FACTS})
    | bad_content(FACTS).map(lambda facts: b'{"facts": ' + facts + b"}")
)
def test_the_surveys_answer_is_read_or_said_in_one_line(
    tmp_path: Path, content: bytes | None
) -> None:
    """The survey child's facts.json: facts of this version, or FactoryFailed in one
    line (its log's last line where it wrote no answer)."""
    from autotune.core.job import JobFacts

    answer_path, log = tmp_path / "facts.json", tmp_path / "stderr.log"
    answer_path.unlink(missing_ok=True)
    if content is not None:
        answer_path.write_bytes(content)
    log.write_text("Traceback (most recent call last):\nRuntimeError: it died\n")
    answer = _answer(answer_path, log, 1)
    assert isinstance(answer, dict) and ("facts" in answer or isinstance(answer["error"], str))
    try:
        facts = _facts(answer, "train.py:make")
    except FactoryFailed as exc:
        assert one_line(str(exc)), str(exc)
    else:
        assert isinstance(facts, JobFacts)


class _Pipe:
    """What `_read_reply` reads of a fork server: its output pipe, and whether it ended."""

    def __init__(self, fd: int) -> None:
        self.stdout = open(fd, "rb", buffering=0)  # closed by the test

    def poll(self) -> int | None:
        return None


@examples(100)
@given(line=bad_content({"pid": 123, "returncode": 0}))
def test_a_fork_servers_reply_is_read_or_said_in_one_line(line: bytes) -> None:
    """A reply line of the fork server's pipe: a JSON object, or LaunchError in one line."""
    import os

    from autotune.core.errors import LaunchError
    from autotune.launch.forkserver import _read_reply

    first = line.split(b"\n")[0][:60_000]  # within the pipe's buffer: no reader yet
    read, write = os.pipe()
    pipe = _Pipe(read)
    try:
        os.write(write, first + b"\n")
        try:
            reply, rest = _read_reply(pipe, b"", 5.0, "server.log")  # type: ignore[arg-type]
        except LaunchError as exc:
            assert one_line(str(exc)) and "server.log" in str(exc), str(exc)
        else:
            assert isinstance(reply, dict) and rest == b""
    finally:
        os.close(write)
        pipe.stdout.close()
