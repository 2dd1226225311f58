"""The user's own data: load it, tokenize it once, read its lengths and padding waste.

Probes still measure memory on the worst case (every sequence as long as the longest
the user trains with). The tokenized data, saved beside the study, also lets each
probe time real batches with the candidate's sampling and count real (non-pad)
tokens; the length distribution and the padding waste of each sampling are computed
here, once per search, not per trial.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from autotune.core.dataset import DataSpec, LengthStats
from autotune.core.enums import Task
from autotune.core.errors import UsageError
from autotune.core.files import parse_json
from autotune.core.space import SAMPLINGS

# Deferred imports: datasets and transformers load only when a --dataset is prepared; the
# planner imports this module for every search

FILE_KINDS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".txt": "text",
}
LENGTH_COLUMN = "length"  # TrainingArguments.length_column_name's default


def load_source(source: str, *, split: str) -> Any:
    """A `datasets.Dataset` from a save_to_disk folder, a local file, or the hub."""
    import datasets

    datasets.disable_progress_bars()  # one line per event, not a progress bar per file
    path = Path(source).expanduser()
    before = datasets.logging.get_verbosity()
    # its own stderr handler logs a malformed file before raising: the one line is ours
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        if path.is_dir():
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise UsageError(
                        f"--dataset {source} has no split {split!r}; it has "
                        f"{_names(loaded)}; pass --dataset-split"
                    )
                loaded = loaded[split]
            return loaded
        if path.is_file():
            kind = FILE_KINDS.get(path.suffix.lower())
            if kind is None:
                raise UsageError(
                    f"--dataset {source}: cannot read {path.suffix!r} files; use "
                    f"{', '.join(FILE_KINDS)} or a save_to_disk folder"
                )
            if kind == "json":
                _check_json_rows(path, source)
            return datasets.load_dataset(kind, data_files=str(path), split="train")
        if source.startswith((".", "/", "~")):
            raise UsageError(f"--dataset {source}: no such file or folder")
        return datasets.load_dataset(source, split=split)
    except UsageError:
        raise
    except Exception as exc:  # the hub offline, a malformed file, a missing split
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UsageError(f"cannot load --dataset {source}: {first}") from None
    finally:
        datasets.logging.set_verbosity(before)


def _check_json_rows(path: Path, source: str) -> None:
    """Every row of a JSON Lines file (or every element of a .json list) is a JSON object
    that Python reads; UsageError naming the first that is not. Read here, before
    `datasets`: its readers kill the process (SIGSEGV) on some (pyarrow 26 where the first
    row is null, pandas' on rows nested some 10,000 deep). Costs less than the tokenizing."""
    try:
        rows = _lines(path)
        if path.suffix.lower() != ".jsonl":
            try:
                whole = parse_json(path.read_bytes())
            except ValueError:
                pass  # JSON Lines, as datasets' own to_json writes a .json: line by line
            else:
                if isinstance(whole, dict):  # an object of columns: datasets reads it
                    return
                if not isinstance(whole, list):
                    shown = json.dumps(whole)[:40]
                    raise UsageError(f"--dataset {source} holds {shown}, not JSON objects")
                rows = ((f"row {n}", row) for n, row in enumerate(whole, 1))
        for where, row in rows:
            if not isinstance(row, dict):
                shown = json.dumps(row)[:40]
                raise UsageError(f"--dataset {source}: {where} is {shown}, not a JSON object")
    except ValueError as exc:  # not UTF-8, not JSON, too deep, a number too long
        raise UsageError(f"--dataset {source} is not valid JSON ({exc})") from None


def _lines(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield f"line {n}", parse_json(line)
                except ValueError as exc:
                    raise ValueError(f"line {n}: {exc}") from None


def load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise UsageError(
            f"cannot load tokenizer {name!r}: {first}; pass --tokenizer with a "
            "folder holding tokenizer files, or a hub id in your cache"
        ) from None
    if tokenizer.pad_token is None:  # GPT-2 style: pad with the end-of-text token
        if tokenizer.eos_token is None:
            raise UsageError(f"tokenizer {name!r} has neither a pad nor an end token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def prepare(
    *,
    source: str,
    split: str,
    task: str,
    text_column: str | None,
    target_column: str | None,
    tokenizer: str | None,
    model_name: str,
    vocab_size: int,
    seq_len: int | None,
    target_len: int | None,
    max_positions: int | None,
    micro_batches: Sequence[int],
    global_batch: int,
    out_dir: Path,
) -> tuple[DataSpec, int, int]:
    """Tokenize once, save beside the study; returns (data, seq_len, target_len) where a
    length not given is the data's longest (capped by the model's positions)."""
    table = load_source(source, split=split)
    if len(table) == 0:
        raise UsageError(f"--dataset {source} is empty")
    tokens = _token_ids(table, source, task, text_column, target_column, tokenizer or model_name)
    ids, targets, used_tokenizer = tokens.ids, tokens.targets, tokens.tokenizer
    text_column, target_column, columns = tokens.text_column, tokens.target_column, tokens.columns
    lengths = [len(x) for x in ids]
    if min(lengths) == 0:
        raise UsageError(f"--dataset {source} has empty samples in {text_column!r}; drop them")
    _check_vocab(ids, targets, vocab_size, used_tokenizer or source)
    seq_len = seq_len or min(max(lengths), max_positions or max(lengths))
    if max_positions is not None and seq_len > max_positions:
        raise UsageError(f"--seq-len {seq_len} exceeds the model's {max_positions} positions")
    target_stats = LengthStats.of([len(t) for t in targets]) if targets else None
    if targets is not None:
        target_len = target_len or (target_stats.max if target_stats else 1)
    cut = sum(n > seq_len for n in lengths) / len(lengths)
    rows: dict[str, Any] = {"input_ids": [x[:seq_len] for x in ids]}
    rows[LENGTH_COLUMN] = [min(n, seq_len) for n in lengths]
    if targets is not None:
        rows["labels"] = [t[: target_len or len(t)] for t in targets]
    if task == Task.CLASSIFICATION:
        rows["labels"] = _class_labels(table, columns, target_column, source)
    fingerprint, saved = _saved(rows, out_dir)
    data = DataSpec(
        source=source,
        path=str(saved.resolve()),
        tokenizer=used_tokenizer,
        text_column=text_column or "",
        target_column=target_column or "",
        lengths=LengthStats.of(lengths),
        target_lengths=target_stats,
        truncated=round(cut, 4),
        padding_waste=_wastes(rows[LENGTH_COLUMN], micro_batches, global_batch),
        fingerprint=fingerprint,
        pad_token_id=tokens.pad_id,
    )
    return data, seq_len, target_len or 0


def _wastes(
    lengths: Sequence[int], micro_batches: Sequence[int], global_batch: int
) -> dict[str, dict[str, float]]:
    """The padding waste of each per-device batch under each sampling order."""
    return {
        str(b): {s: round(padding_waste(lengths, b, global_batch, s), 4) for s in SAMPLINGS}
        for b in micro_batches
    }


def _saved(rows: dict[str, Any], out_dir: Path) -> tuple[str, Path]:
    """Save the tokenized rows by content (a rerun reuses them): (fingerprint, folder)."""
    fingerprint = hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]
    saved = out_dir / f"tokenized-{fingerprint}"
    if not saved.exists():
        _save(rows, saved)
    return fingerprint, saved


@dataclasses.dataclass(frozen=True)
class _Tokens:
    """A dataset's token ids, and where they came from."""

    ids: list[list[int]]
    targets: list[list[int]] | None  # seq2seq labels
    columns: list[str]
    text_column: str
    target_column: str | None
    tokenizer: str  # "" when the data came tokenized
    pad_id: int


def _token_ids(
    table: Any,
    source: str,
    task: str,
    text_column: str | None,
    target_column: str | None,
    tokenizer: str,
) -> _Tokens:
    """The dataset's ids as given (an input_ids column), else its text tokenized."""
    columns = list(table.column_names)
    if "input_ids" in columns:
        ids = _id_lists(table["input_ids"], source, "input_ids")
        seq2seq = task == Task.SEQ2SEQ
        targets = (
            _id_lists(table["labels"], source, "labels")
            if seq2seq and "labels" in columns
            else None
        )
        if seq2seq and targets is None:
            raise UsageError(f"--dataset {source} has input_ids but no labels for seq2seq")
        return _Tokens(ids, targets, columns, text_column or "input_ids", target_column, "", 0)
    text_column = text_column or _pick(columns, ("text", "content", "sentence", "source"))
    if text_column not in columns:
        raise UsageError(
            f"--dataset {source} has no column {text_column!r}; columns: "
            f"{_names(columns)}; pass --text-column"
        )
    tok = load_tokenizer(tokenizer)
    ids = tok([str(t) for t in table[text_column]], truncation=False)["input_ids"]
    targets = None
    if task == Task.SEQ2SEQ:
        target_column = target_column or _pick(columns, ("target", "summary", "labels"))
        if target_column not in columns:
            raise UsageError(
                f"seq2seq needs a target column; --dataset {source} has "
                f"{_names(columns)}; pass --target-column"
            )
        texts = [str(t) for t in table[target_column]]
        targets = tok(text_target=texts, truncation=False)["input_ids"]
    return _Tokens(
        ids, targets, columns, text_column, target_column, tokenizer, int(tok.pad_token_id)
    )


def _id_lists(rows: Sequence[Any], source: str, column: str) -> list[list[int]]:
    """A column of token ids as given: each row a list of whole numbers from 0 (Arrow
    may hold them as floats); UsageError naming the first row that is not."""
    found = []
    for n, row in enumerate(rows):
        ok = isinstance(row, list) and all(
            (type(t) is int or (isinstance(t, float) and t.is_integer())) and t >= 0 for t in row
        )
        if not ok:
            shown = repr(row) if len(repr(row)) <= 60 else repr(row)[:57] + "..."
            raise UsageError(
                f"--dataset {source}: row {n} of {column!r} is {shown}; token ids are lists "
                "of whole numbers from 0"
            )
        found.append([int(t) for t in row])
    return found


def padding_waste(
    lengths: Sequence[int], micro_batch: int, group: int, sampling: str, seed: int = 0
) -> float:
    """Pad share of the tokens fed when each micro-batch is padded to its longest.

    `random` is Trainer's default shuffled order; `group_by_length` follows
    transformers' LengthGroupedSampler: shuffled, cut into mega-batches of 50 groups
    (a group is micro-batch x accumulation samples), each sorted longest first.
    """
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    if sampling == "group_by_length":
        mult = max(1, min(len(lengths) // (group * 4), 50))
        size = mult * group
        order = [
            i
            for start in range(0, len(order), size)
            for i in sorted(order[start : start + size], key=lambda i: -lengths[i])
        ]
    fed = real = 0
    for start in range(0, len(order), micro_batch):
        batch = [lengths[i] for i in order[start : start + micro_batch]]
        fed += max(batch) * len(batch)
        real += sum(batch)
    return 1.0 - real / fed if fed else 0.0


def _names(names: Any) -> str:
    """Column or split names as an error lists them: a name a line cannot hold as it is
    (a newline in a JSON key, or none at all) quoted, so the error stays one line."""
    return ", ".join(n if n and n.isprintable() else repr(n) for n in map(str, names))


def _pick(columns: list[str], preferred: tuple[str, ...]) -> str:
    return next((c for c in preferred if c in columns), columns[0])


def _class_labels(table: Any, columns: list[str], column: str | None, source: str) -> list[int]:
    """Class ids for a classifier: a column of whole numbers (`label` by default)."""
    column = column or next((c for c in ("label", "labels") if c in columns), None)
    if column is None or column not in columns:
        raise UsageError(
            f"classification needs a label column; --dataset {source} has "
            f"{_names(columns)}; pass --target-column"
        )
    values = list(table[column])
    # a list, not next(..., None): a missing label (None) is one to refuse
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    if bad:
        raise UsageError(
            f"--dataset {source}: labels in {column!r} must be class ids (whole numbers from "
            f"0), found {bad[0]!r}; map the classes to 0, 1, ... first"
        )
    return [int(v) for v in values]


def _check_vocab(
    ids: list[list[int]], targets: list[list[int]] | None, vocab_size: int, where: str
) -> None:
    top = max(max(x) for x in ids if x)
    if targets:
        top = max(top, max((max(t) for t in targets if t), default=0))
    if top >= vocab_size:
        raise UsageError(
            f"token id {top} from {where} is outside the model's vocabulary of "
            f"{vocab_size}; use the model's tokenizer or a model config with a "
            "larger vocab_size"
        )


def _save(rows: dict[str, Any], folder: Path) -> None:
    """Write the tokenized data; a half-written folder is never left under its name."""

    import datasets

    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    datasets.Dataset.from_dict(rows).save_to_disk(str(partial))
    partial.rename(folder)
