"""The user's arguments files (`--base-args`, `--peft-config`) with bad content,
generated: a one-line UsageError naming the file, or the file read as it was meant;
never a traceback, never the file changed. (`--merge-into`: tests/views/test_export_files.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from bad_files import JSON_VALUES, bad_content, examples, one_line, refused, run_cli
from hypothesis import given
from hypothesis import strategies as st

from autotune.core.errors import UsageError
from autotune.hf.peft import adapter_settings
from autotune.hf.training_args import read_json_object, training_fields
from autotune.tuning.resolve import read_base

USER_ARGS: dict[str, Any] = {
    "output_dir": "my-run",
    "learning_rate": 3e-4,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 17,
    "per_device_train_batch_size": 32,
    "gradient_accumulation_steps": 2,
    "max_seq_length": 128,
    "max_steps": 100,
    "weight_decay": 0.01,
    "report_to": "none",
    "seed": 7,
}
FIELDS = sorted(training_fields())
ADAPTER = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "lora_dropout": 0.05}


def _written(folder: Path, content: bytes, name: str = "args.json") -> Path:
    path = folder / name
    path.write_bytes(content)
    return path


def _read_or_refused(path: Path) -> None:
    """read_base reads the file whole, or refuses it in one line naming it."""
    try:
        base = read_base(path, None)
    except UsageError as exc:
        assert one_line(str(exc)) and str(path) in str(exc), str(exc)
    else:
        for value in (base.process_batch_size, base.seq_len, base.target_len, base.train_steps):
            assert value is None or (type(value) is int and value >= 1)
        assert isinstance(base.carried, dict) and isinstance(base.recipe, dict)


@examples(100)
@given(content=bad_content(USER_ARGS))
def test_base_args_are_read_or_refused_in_one_line(tmp_path: Path, content: bytes) -> None:
    path = _written(tmp_path, content)
    _read_or_refused(path)
    assert path.read_bytes() == content


@examples(100)
@given(fields=st.lists(st.tuples(st.sampled_from(FIELDS), JSON_VALUES), min_size=1, max_size=3))
def test_any_value_of_any_training_field_is_taken_or_refused_in_one_line(
    tmp_path: Path, fields: list[tuple[str, Any]]
) -> None:
    """TrainingArguments' fields, each given a value of any JSON type: HfArgumentParser
    and the class's own checks refuse it, said in one line, or it is read."""
    content = json.dumps({**USER_ARGS, **dict(fields)}).encode()
    path = _written(tmp_path, content)
    _read_or_refused(path)
    assert path.read_bytes() == content


@examples(15)
@given(content=bad_content(USER_ARGS))
def test_the_search_refuses_bad_base_args_in_one_line(
    tmp_path: Path,
    content: bytes,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Through the command: exit status 2, one line naming the file, no traceback, the
    file as it was. The model named does not exist, so a file that reads well fails there
    (nothing is searched)."""
    monkeypatch.chdir(tmp_path)
    path = _written(tmp_path, content)
    argv = ["search", "--model", "./no-model", "--no-fork-server", "--base-args", path.name]
    code, err = run_cli(argv, capsys)
    assert code == 2 and "Traceback" not in err, err
    try:
        read_base(path, None)
    except UsageError:
        assert refused(code, err, path), err
    else:
        assert "./no-model" in err
    assert path.read_bytes() == content
    assert not (tmp_path / "studies").exists()


@examples(100)
@given(content=bad_content(ADAPTER))
def test_a_peft_config_is_read_or_refused_in_one_line(tmp_path: Path, content: bytes) -> None:
    path = _written(tmp_path, content, "adapter_config.json")
    try:
        found = adapter_settings(None, path)
    except UsageError as exc:
        assert one_line(str(exc)) and str(path) in str(exc), str(exc)
    else:
        assert isinstance(found, dict)
    assert path.read_bytes() == content


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[" * 5000 + b"]" * 5000, r"is not valid JSON \(nested deeper than can be read\)"),
        (b'{"seed": ' + b"9" * 5000 + b"}", r"not valid JSON \(a number has more digits"),
        (b"\xff\xfe{}", r"is not valid JSON \('utf-8' codec can't decode"),
    ],
    ids=["deep", "long", "binary"],
)
def test_json_too_deep_or_too_long_for_the_parser_is_not_valid_json(
    tmp_path: Path, content: bytes, message: str
) -> None:
    """Found by the generated cases: RecursionError and int()'s digit limit escaped as
    tracebacks."""
    path = _written(tmp_path, content)
    with pytest.raises(UsageError, match=message) as info:
        read_json_object(path, option="--base-args")
    assert one_line(str(info.value)) and str(path) in str(info.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        # found by the generated cases: TrainingArguments opened these numbers as file
        # descriptors (1 read and closed the process's stdout; 0 waited on stdin)
        ({"accelerator_config": 1}, "accelerator_config is 1; give the path of a JSON file"),
        ({"deepspeed": True}, "deepspeed is True; give the path of a JSON file"),
        ({"accelerator_config": False}, "accelerator_config is False"),
        # and its checks raised an AttributeError on a list where a name goes
        ({"metric_for_best_model": []}, "TrainingArguments refuses it: 'list' object"),
    ],
)
def test_values_the_arguments_class_cannot_take_are_refused_in_one_line(
    tmp_path: Path, fields: dict[str, Any], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _written(tmp_path, json.dumps({**USER_ARGS, **fields}).encode())
    with pytest.raises(UsageError, match=message) as info:
        read_base(path, None)
    assert one_line(str(info.value)) and str(path) in str(info.value)
    print("stdout still open")
    assert capsys.readouterr().out == "stdout still open\n"


def test_a_good_file_is_read_whole(tmp_path: Path) -> None:
    """The oracle the generated cases lean on: a good file is read, not refused."""
    base = read_base(_written(tmp_path, json.dumps(USER_ARGS).encode()), None)
    assert base.process_batch_size == 64 and base.seq_len == 128 and base.train_steps == 100


@examples(25)
@given(
    key=st.sampled_from(["per_device_train_batch_size", "max_seq_length", "max_steps"]),
    value=st.one_of(
        st.floats().filter(lambda v: v != -1),
        st.text(max_size=5),
        st.integers(max_value=0).filter(lambda v: v != -1),
    ),
)
def test_a_batch_or_length_that_is_no_whole_number_is_named(
    tmp_path: Path, key: str, value: Any
) -> None:
    path = _written(tmp_path, json.dumps({**USER_ARGS, key: value}).encode())
    with pytest.raises(UsageError, match=key) as info:
        read_base(path, None)
    assert one_line(str(info.value)) and str(path) in str(info.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        # found by the generated cases: LoraConfig took a list for r, then int() raised
        ({"r": [[]]}, "r is [[]]; it must be a whole number"),
        ({"lora_dropout": float("nan")}, "lora_dropout is nan; it must be a number from 0 up"),
        ({"target_modules": [1]}, "target_modules is [1]; it must be a layer name"),
    ],
)
def test_a_peft_config_of_the_wrong_types_is_refused_in_one_line(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    path = _written(tmp_path, json.dumps({**ADAPTER, **fields}).encode(), "adapter_config.json")
    with pytest.raises(UsageError, match=re.escape(message)) as info:
        adapter_settings(None, path)
    assert one_line(str(info.value)) and str(path) in str(info.value)
