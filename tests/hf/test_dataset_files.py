"""The user's data files (`--dataset x.jsonl|.json|.csv|.txt`) with bad content,
generated: tokenized and measured, or a one-line UsageError naming the file; never a
traceback, never the file changed, and no token id the model cannot embed let through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bad_files import JSON_VALUES, bad_content, examples, one_line, refused, run_cli
from conftest import TINY_GPT2, write_model
from helpers import word_tokenizer
from hypothesis import assume, example, given
from hypothesis import strategies as st

from autotune.core.enums import Task
from autotune.core.errors import UsageError
from autotune.hf.corpus import prepare

VOCAB = 100
WORDS = "a b c d e f g h"
COLUMNS = ["text", "input_ids", "labels", "label", "target", "other"]
ROWS = st.lists(
    st.dictionaries(
        st.sampled_from(COLUMNS),
        JSON_VALUES
        | st.text(alphabet="abcdefgh ", max_size=20)
        | st.lists(st.integers(-5, VOCAB + 5), max_size=6),
        max_size=3,
    ),
    min_size=1,
    max_size=5,
)
JSONL = ROWS.map(lambda rows: "".join(json.dumps(r) + "\n" for r in rows).encode())
CSV = st.lists(
    st.lists(st.text(alphabet='abc,"\n 1-\x00é', max_size=8), min_size=1, max_size=3),
    min_size=1,
    max_size=4,
).map(lambda rows: ("text,label\n" + "\n".join(",".join(r) for r in rows)).encode())
FILES = st.one_of(
    st.tuples(st.just(".jsonl"), JSONL | bad_content({"text": WORDS, "label": 1})),
    st.tuples(st.just(".json"), ROWS.map(lambda rows: json.dumps(rows).encode()) | bad_content()),
    st.tuples(st.just(".csv"), CSV | bad_content()),
    st.tuples(st.just(".txt"), bad_content()),
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return word_tokenizer(tmp_path_factory.mktemp("tokenizer"), [WORDS])


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """datasets' cache of each generated file in the test's folder, not the user's."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")


def _prepare(path: Path, tokenizer: Path, task: str, out: Path, vocab: int = VOCAB) -> Any:
    return prepare(
        source=str(path),
        split="train",
        task=task,
        text_column=None,
        target_column=None,
        tokenizer=str(tokenizer),
        model_name="unused",
        vocab_size=vocab,
        seq_len=None,
        target_len=None,
        max_positions=64,
        micro_batches=(1, 2),
        global_batch=2,
        out_dir=out,
    )


@examples(60)
@given(file=FILES, task=st.sampled_from([Task.CAUSAL_LM, Task.SEQ2SEQ, Task.CLASSIFICATION]))
# a key that is a newline: the refusal listed the columns as they are, over two lines
@example(file=(".jsonl", b'{"\\n": null}'), task=Task.CLASSIFICATION)
def test_a_data_file_is_measured_or_refused_in_one_line(
    tmp_path: Path, tokenizer: Path, file: tuple[str, bytes], task: str
) -> None:
    suffix, content = file
    path = tmp_path / f"data{suffix}"
    path.write_bytes(content)
    try:
        data, seq_len, _ = _prepare(path, tokenizer, task, tmp_path / "out")
    except UsageError as exc:
        assert one_line(str(exc)) and str(path) in str(exc), str(exc)
    else:
        import datasets

        ids = datasets.load_from_disk(data.path)["input_ids"]
        assert all(0 <= t < VOCAB for row in ids for t in row)
        assert 1 <= seq_len <= 64 and data.lengths.count == len(ids)
    assert path.read_bytes() == content


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # found by the generated cases: pyarrow's JSON reader killed the process (SIGSEGV)
        (b"null\n", "line 1 is null, not a JSON object"),
        (b'[null, {"text": "a"}]', "row 1 is null, not a JSON object"),
        (b'{"a":' * 12_000 + b"1" + b"}" * 12_000, "nested deeper than can be read"),
        # and these raised out of the tokenizing: int('a'), int(None), a negative id
        (b'{"input_ids": "a"}', "row 0 of 'input_ids' is 'a'; token ids are lists"),
        (b'{"input_ids": null}', "row 0 of 'input_ids' is None"),
        (b'{"input_ids": [3, -1]}', "row 0 of 'input_ids' is [3, -1]"),
        (b'{"input_ids": [3, 1.5]}', "row 0 of 'input_ids' is [3.0, 1.5]"),
    ],
    ids=["null", "null-in-list", "deep", "text-ids", "null-ids", "negative-id", "fraction"],
)
def test_data_that_crashed_or_passed_before_is_refused_in_one_line(
    tmp_path: Path, tokenizer: Path, content: bytes, message: str
) -> None:
    path = tmp_path / ("data.json" if content.startswith(b"[") else "data.jsonl")
    path.write_bytes(content)
    with pytest.raises(UsageError) as info:
        _prepare(path, tokenizer, Task.CAUSAL_LM, tmp_path / "out")
    said = str(info.value)
    assert message in said and one_line(said) and str(path) in said


@pytest.mark.parametrize("label", ["null", "-1", "1.5", '"cat"'])
def test_a_class_label_that_is_no_class_id_is_refused(
    tmp_path: Path, tokenizer: Path, label: str
) -> None:
    """Found by the generated cases: a missing label (None) passed the check, whose
    `next(..., None)` read it as "none bad", then int(None) raised."""
    path = tmp_path / "data.jsonl"
    path.write_text(f'{{"text": "a b", "label": 1}}\n{{"text": "c", "label": {label}}}\n')
    with pytest.raises(UsageError, match="must be class ids") as info:
        _prepare(path, tokenizer, Task.CLASSIFICATION, tmp_path / "out")
    assert one_line(str(info.value))


@examples(8)
@given(file=FILES)
def test_the_search_refuses_bad_data_in_one_line(
    tmp_path: Path,
    tokenizer: Path,
    file: tuple[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Through the command, for a file the reading refuses (read as the search will:
    the same tokenizer and vocabulary): exit status 2, one line naming the file, no
    traceback, the file as it was."""
    suffix, content = file
    path = tmp_path / f"data{suffix}"
    path.write_bytes(content)
    try:
        _prepare(path, tokenizer, Task.CAUSAL_LM, tmp_path / "out", vocab=TINY_GPT2["vocab_size"])
    except UsageError:
        pass
    else:
        assume(False)  # data that reads would start a search
    monkeypatch.chdir(tmp_path)
    write_model(tmp_path / "tiny", TINY_GPT2)
    argv = ["search", "--model", "./tiny", "--dataset", path.name, "--tokenizer", str(tokenizer)]
    argv += ["--no-fork-server", "--device", "cpu", "--max-trials", "1", "--time-budget", "10s"]
    code, err = run_cli(argv, capsys)
    assert code == 2 and refused(code, err, path), err
    assert path.read_bytes() == content
