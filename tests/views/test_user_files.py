"""Nothing of the user's is lost or loosened: export targets, merges, modes, links."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from helpers import SPEC, cand, rec

from autotune.core.enums import Objective
from autotune.core.errors import ExportError
from autotune.core.files import write_atomic
from autotune.views.export import export_best, previous_export, sidecar_path


def export(output: Path, *, force: bool = False) -> Path:
    return export_best(
        record=rec(1, cand(16), sps=2.0, peak_gib=1.0),
        spec=SPEC,
        study_name="s",
        output=output,
        runners_up=[],
        objective=Objective.THROUGHPUT,
        validate=False,
        force=force,
    )


def test_an_export_never_replaces_a_file_autotune_did_not_write(tmp_path: Path) -> None:
    mine = tmp_path / "my_args.json"
    mine.write_text('{"learning_rate": 0.1}')
    with pytest.raises(ExportError, match=r"not written by autotune; .* --force"):
        export(mine)
    assert json.loads(mine.read_text()) == {"learning_rate": 0.1}
    export(mine, force=True)
    assert json.loads(mine.read_text())["per_device_train_batch_size"] == 16


def test_an_export_never_goes_over_a_database(tmp_path: Path) -> None:
    db = tmp_path / "autotune.db"
    db.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    with pytest.raises(ExportError, match="database"):
        export(db, force=True)
    assert db.read_bytes().startswith(b"SQLite format 3")


def test_fields_the_user_added_to_an_export_survive_the_next_one(tmp_path: Path) -> None:
    out = export(tmp_path / "best.json")
    added = {**json.loads(out.read_text()), "output_dir": "runs/x", "learning_rate": 3e-4}
    out.write_text(json.dumps(added))
    export(out)
    again = json.loads(out.read_text())
    assert again["output_dir"] == "runs/x" and again["learning_rate"] == 3e-4
    assert again["per_device_train_batch_size"] == 16
    assert json.loads(sidecar_path(out).read_text())["study"] == "s"
    assert previous_export(out, force=False)["output_dir"] == "runs/x"


def test_a_rewrite_keeps_the_mode_and_the_link(tmp_path: Path) -> None:
    target = tmp_path / "secret_args.json"
    target.write_text('{"hub_token": "t"}')
    os.chmod(target, 0o600)
    link = tmp_path / "args.json"
    link.symlink_to(target)
    write_atomic(link, '{"hub_token": "t", "fp16": true}')
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["fp16"] is True
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_fields_an_earlier_export_wrote_do_not_leak_into_the_next(tmp_path: Path) -> None:
    """A CPU export's use_cpu must not survive into a CUDA export of the same file."""
    import dataclasses

    from autotune.core.device import DeviceInfo
    from autotune.core.enums import DeviceKind

    out = export(tmp_path / "best.json")
    assert json.loads(out.read_text())["use_cpu"] is True
    gpu = dataclasses.replace(SPEC, device=DeviceInfo(DeviceKind.CUDA, 0, "A100", 2**36, (8, 0)))
    export_best(
        record=rec(1, cand(16), sps=2.0, peak_gib=1.0),
        spec=gpu,
        study_name="s",
        output=out,
        runners_up=[],
        objective=Objective.THROUGHPUT,
        validate=False,
    )
    again = json.loads(out.read_text())
    assert "use_cpu" not in again and again["tf32"] is False


def test_checking_an_export_prints_nothing_of_this_machine(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The main job ended with transformers' "speedups for torchdynamo ... not detected
    here" on the user's terminal: the check of a compiled config's arguments, not news."""
    from autotune.hf.training_args import validate

    validate(
        {"torch_compile": True, "per_device_train_batch_size": 8}, error=ExportError, where="test"
    )
    assert capfd.readouterr().err == ""
