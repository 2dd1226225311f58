"""The files export reads before it writes, with bad content, generated: an existing
`--output` and its sidecar `<name>.summary.json`, the sidecar read back for the script's
notes, and the user's own file `--merge-into` rewrites. Each is read, or refused in one
line naming it; never a traceback, and a file of the user's is never changed by a
refusal."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from bad_files import bad_content, examples, one_line, refused, run_cli
from conftest import ROOT
from helpers import SPEC, cand, rec
from hypothesis import example, given
from hypothesis import strategies as st

from autotune.core.enums import Objective
from autotune.core.errors import ExportError
from autotune.hf.training_args import TUNED
from autotune.views.export import export_best, previous_export, sidecar_path, written_script_changes

EXPORTED = {"per_device_train_batch_size": 16, "optim": "adamw_torch", "output_dir": "mine"}
SIDECAR: dict[str, Any] = {
    "study": "s",
    "best": {"trial": 1, "samples_per_s": 2.0},
    "arguments": {"per_device_train_batch_size": 16, "optim": "adamw_torch"},
    "your_arguments": {},
    "script_changes": ["model = AutoModel.from_pretrained(..., attn_implementation='sdpa')"],
}
USER_ARGS = {"learning_rate": 3e-4, "per_device_train_batch_size": 32, "output_dir": "run"}
SIDECARS = st.none() | bad_content(SIDECAR) | st.just(json.dumps(SIDECAR).encode())


def _files(folder: Path, output: bytes, sidecar: bytes | None) -> Path:
    path = folder / "best.json"
    path.write_bytes(output)
    sidecar_path(path).unlink(missing_ok=True)
    if sidecar is not None:
        sidecar_path(path).write_bytes(sidecar)
    return path


def _export(output: Path) -> Path:
    return export_best(
        record=rec(1, cand(16), sps=2.0, peak_gib=1.0),
        spec=SPEC,
        study_name="s",
        output=output,
        runners_up=[],
        objective=Objective.THROUGHPUT,
        validate=False,
    )


@examples(150)
@given(output=bad_content(EXPORTED), sidecar=SIDECARS)
@example(output=b"SQLite format 3\x00", sidecar=None)  # a database: refused for that
def test_an_export_over_a_bad_file_is_refused_in_one_line_or_written_whole(
    tmp_path: Path, output: bytes, sidecar: bytes | None
) -> None:
    """A file autotune did not write (its sidecar does not say so, or cannot be read)
    is refused and left as it was; one it wrote is replaced by a whole export that keeps
    the fields the user added."""
    path = _files(tmp_path, output, sidecar)
    try:
        kept = previous_export(path, force=False)
    except ExportError as exc:
        assert one_line(str(exc)) and str(path) in str(exc), str(exc)
        with pytest.raises(ExportError) as refused:  # the export says the same: a file
            _export(path)  # it did not write, or a database (b"SQLite format 3\x00...")
        assert str(refused.value) == str(exc)
        assert path.read_bytes() == output
        assert (sidecar_path(path).read_bytes() if sidecar is not None else None) == sidecar
        return
    _export(path)
    written = json.loads(path.read_text())
    assert written["per_device_train_batch_size"] == 16
    for key, value in kept.items():  # what the user added is kept (NaN as NaN)
        if key not in TUNED:
            assert json.dumps(written[key], sort_keys=True) == json.dumps(value, sort_keys=True)
    assert json.loads(sidecar_path(path).read_text())["study"] == "s"


@examples(150)
@given(sidecar=SIDECARS)
def test_the_sidecar_read_back_gives_its_lines_or_says_what_is_wrong(
    tmp_path: Path, sidecar: bytes | None
) -> None:
    path = _files(tmp_path, json.dumps(EXPORTED).encode(), sidecar)
    try:
        lines = written_script_changes(path)
    except ExportError as exc:
        assert one_line(str(exc)) and str(sidecar_path(path)) in str(exc), str(exc)
    else:
        assert all(isinstance(line, str) for line in lines)


@pytest.mark.parametrize(
    ("sidecar", "kept"),
    [
        # found by the generated cases: `{**written, **"text"}` raised a TypeError
        ({**SIDECAR, "your_arguments": "x"}, None),
        ({**SIDECAR, "your_arguments": [1]}, None),
        (b"[" * 5000 + b"]" * 5000, None),  # RecursionError escaped
        ({**SIDECAR, "your_arguments": {"output_dir": "mine"}}, {}),
        (SIDECAR, {"output_dir": "mine"}),
    ],
    ids=["text", "list", "deep", "theirs", "ours"],
)
def test_an_export_is_replaced_only_where_its_sidecar_reads_as_autotunes(
    tmp_path: Path, sidecar: Any, kept: dict[str, Any] | None
) -> None:
    raw = sidecar if isinstance(sidecar, bytes) else json.dumps(sidecar).encode()
    path = _files(tmp_path, json.dumps(EXPORTED).encode(), raw)
    if kept is None:
        with pytest.raises(ExportError, match="was not written by autotune"):
            previous_export(path, force=False)
    else:
        assert previous_export(path, force=False) == kept


@pytest.mark.parametrize(
    ("sidecar", "message"),
    [
        # found by the generated cases: AttributeError, RecursionError, a string's letters
        (b"[1]", "is not an export's summary"),
        (b"[" * 5000 + b"]" * 5000, "nested deeper than can be read"),
        (json.dumps({**SIDECAR, "script_changes": "abc"}).encode(), "is not an export's"),
        (b"\xff", "'utf-8' codec can't decode"),
    ],
    ids=["list", "deep", "text", "binary"],
)
def test_a_sidecar_that_is_no_summary_is_said_in_one_line(
    tmp_path: Path, sidecar: bytes, message: str
) -> None:
    path = _files(tmp_path, json.dumps(EXPORTED).encode(), sidecar)
    with pytest.raises(ExportError, match=message) as info:
        written_script_changes(path)
    assert one_line(str(info.value)) and str(sidecar_path(path)) in str(info.value)


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The recorded example study (tuned on the CPU), copied: --study and --storage."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "examples" / "demo" / "autotune.db", tmp_path / "demo.db")
    return ["--study", "mt5-small", "--storage", "sqlite:///demo.db"]


@examples(12)
@given(content=bad_content(USER_ARGS))
def test_merge_into_a_bad_file_is_refused_in_one_line_and_leaves_it(
    demo: list[str], tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the command: a file that reads is merged (the user's fields kept); any
    other is refused with one line naming it, no traceback, exit status 2, and is left
    byte for byte as it was."""
    mine = tmp_path / "mine.json"
    mine.write_bytes(content)
    code, err = run_cli(["export", *demo, "--merge-into", mine.name], capsys)
    assert "Traceback" not in err
    if code != 0:
        assert code == 2 and refused(code, err, mine), err
        assert mine.read_bytes() == content
        return
    before, after = json.loads(content), json.loads(mine.read_text())
    assert after["per_device_train_batch_size"] == 16
    for key, value in before.items():
        if key not in after:  # only the other name of the checkpointing switch goes
            assert key == "gradient_checkpointing"
        elif not (isinstance(value, float) and math.isnan(value)):
            assert key in TUNED or after[key] == value


@examples(10)
@given(output=bad_content(EXPORTED), sidecar=SIDECARS)
def test_export_over_a_bad_output_is_refused_in_one_line_and_leaves_it(
    demo: list[str],
    tmp_path: Path,
    output: bytes,
    sidecar: bytes | None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _files(tmp_path, output, sidecar)
    code, err = run_cli(["export", *demo, "--output", path.name], capsys)
    assert "Traceback" not in err
    if code != 0:
        assert code == 1 and refused(code, err, path), err
        assert path.read_bytes() == output
        assert (sidecar_path(path).read_bytes() if sidecar is not None else None) == sidecar
    else:
        assert json.loads(path.read_text())["per_device_train_batch_size"] == 16
