"""The user's data: loading, tokenizing once, lengths, truncation, padding waste."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import word_tokenizer

from autotune.core.dataset import LengthStats
from autotune.core.errors import UsageError
from autotune.hf.corpus import load_source, padding_waste, prepare


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return word_tokenizer(tmp_path_factory.mktemp("tokenizer"), ["a b c d e f g h", "source"])


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def options(tmp_path: Path, **changes: object) -> dict[str, object]:
    base: dict[str, object] = dict(
        split="train",
        task="causal-lm",
        text_column=None,
        target_column=None,
        tokenizer=None,
        model_name="unused",
        vocab_size=100,
        seq_len=None,
        target_len=None,
        max_positions=64,
        micro_batches=(1, 2),
        global_batch=2,
        out_dir=tmp_path / "data",
    )
    return base | changes


def test_length_statistics_and_percentiles() -> None:
    stats = LengthStats.of(list(range(1, 101)))
    assert (stats.count, stats.max, stats.p50, stats.p90, stats.p99) == (100, 100, 51, 91, 100)
    assert stats.mean == 50.5


def test_grouping_by_length_cuts_padding_and_equal_lengths_have_none() -> None:
    lengths = [5] * 1800 + [200] * 200  # enough for mega-batches of many groups
    random_waste = padding_waste(lengths, 8, 16, "random")
    grouped = padding_waste(lengths, 8, 16, "group_by_length")
    assert random_waste > 0.5 and grouped < random_waste / 3
    assert padding_waste([7] * 50, 8, 16, "random") == 0.0


def test_text_is_tokenized_once_with_lengths_truncation_and_padding_waste(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    rows = [{"text": " ".join("abcdefgh"[: 1 + i % 8])} for i in range(40)]
    source = write_jsonl(tmp_path / "d.jsonl", rows)
    data, seq_len, _ = prepare(
        **options(tmp_path, source=str(source), tokenizer=str(tokenizer_dir), seq_len=6)
    )
    assert data.lengths.max == 8 and data.lengths.count == 40
    assert seq_len == 6 and data.truncated == 0.25  # lengths 7 and 8: 10 of 40 are cut
    assert set(data.padding_waste) == {"1", "2"}
    assert data.padding_waste["1"]["random"] == 0.0  # one sample per batch: no padding
    import datasets

    saved = datasets.load_from_disk(data.path)
    assert max(len(x) for x in saved["input_ids"]) == 6 and "length" in saved.column_names
    again, _, _ = prepare(
        **options(tmp_path, source=str(source), tokenizer=str(tokenizer_dir), seq_len=6)
    )
    assert again.fingerprint == data.fingerprint and again.path == data.path


def test_already_tokenized_data_is_used_as_is(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "tokenized"
    datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5], [6] * 9]}).save_to_disk(
        str(folder)
    )
    data, seq_len, _ = prepare(**options(tmp_path, source=str(folder)))
    assert seq_len == 9 and data.tokenizer == "" and data.lengths.p50 == 3


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("./missing.jsonl", "no such file or folder"),
        ("notes.docx", "cannot read '.docx' files"),
        ("nobody/no-such-dataset-anywhere", "cannot load --dataset nobody/no-such-dataset"),
    ],
)
def test_data_that_cannot_be_read_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "notes.docx").write_text("x")
    with pytest.raises(UsageError, match=message):
        load_source(source, split="train")


def test_tokens_outside_the_models_vocabulary_are_refused(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "tokenized"
    datasets.Dataset.from_dict({"input_ids": [[1, 500]]}).save_to_disk(str(folder))
    with pytest.raises(UsageError, match=r"token id 500 .* outside the model's vocabulary of 100"):
        prepare(**options(tmp_path, source=str(folder)))


def test_a_missing_text_column_names_the_columns(tmp_path: Path, tokenizer_dir: Path) -> None:
    source = write_jsonl(tmp_path / "d.jsonl", [{"body": "a b"}])
    with pytest.raises(UsageError, match=r"no column 'text'.*columns: body"):
        prepare(
            **options(
                tmp_path, source=str(source), text_column="text", tokenizer=str(tokenizer_dir)
            )
        )


def _tokenized(tmp_path: Path, rows: dict[str, list[object]]) -> str:
    import datasets

    folder = tmp_path / "tokenized"
    datasets.Dataset.from_dict(rows).save_to_disk(str(folder))
    return str(folder)


def test_a_dataset_of_only_empty_samples_is_one_clear_error(tmp_path: Path) -> None:
    source = _tokenized(tmp_path, {"input_ids": [[], []]})
    with pytest.raises(UsageError, match="has empty samples"):
        prepare(**options(tmp_path, source=source))


@pytest.mark.parametrize(
    ("rows", "column", "message"),
    [
        ({"input_ids": [[1, 2]], "label": ["pos"]}, None, r"must be class ids .* found 'pos'"),
        ({"input_ids": [[1, 2]], "label": [0.5]}, None, "found 0.5"),
        ({"input_ids": [[1, 2]], "klass": [1]}, None, "needs a label column"),
        ({"input_ids": [[1, 2]], "label": [1]}, "nope", "needs a label column"),
    ],
)
def test_classification_labels_must_be_class_ids_in_a_column_that_exists(
    tmp_path: Path, rows: dict[str, list[object]], column: str | None, message: str
) -> None:
    source = _tokenized(tmp_path, rows)
    with pytest.raises(UsageError, match=message):
        prepare(**options(tmp_path, source=source, task="classification", target_column=column))


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".json", ".jsonl"])
def test_local_files_of_each_format_load(tmp_path: Path, suffix: str) -> None:
    import datasets

    table = datasets.Dataset.from_dict({"text": ["a b", "c d e"], "label": [0, 1]})
    path = tmp_path / f"d{suffix}"
    {
        ".csv": table.to_csv,
        ".parquet": table.to_parquet,
        ".json": table.to_json,
        ".jsonl": table.to_json,
    }[suffix](str(path))
    loaded = load_source(str(path), split="train")
    assert list(loaded["text"]) == ["a b", "c d e"] and list(loaded["label"]) == [0, 1]


def test_a_missing_split_names_the_splits_there_are(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["x"]})}).save_to_disk(
        str(folder)
    )
    with pytest.raises(UsageError, match="has no split 'test'; it has train"):
        load_source(str(folder), split="test")
