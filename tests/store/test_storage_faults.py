"""A storage that cannot be used when a command starts: down, not a database, another
program's database. One line that names it (password masked), a non-zero exit, and
nothing written: no study folder, the file as it was."""

from __future__ import annotations

import hashlib
import socket
import sqlite3
from pathlib import Path

import pytest
from conftest import TINY_GPT2, autotune, write_model

from autotune.store.storage import open_storage

SEARCH = ["search", "--model", "./tiny", "--device", "cpu", "--global-batch-size", "16"]


def closed_port() -> int:
    """A loopback port nothing listens on (bound and released: nothing takes it at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.mark.parametrize("command", [SEARCH, ["show", "--study", "tiny"]])
def test_a_storage_down_at_start_is_named_with_its_password_masked(
    tmp_path: Path, command: list[str]
) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    url = f"postgresql://tuner:hunter2@127.0.0.1:{closed_port()}/studies"
    done = autotune(tmp_path, *command, "--storage", url)
    line = one_error_line(done.stderr)
    assert done.returncode == 1
    assert "hunter2" not in done.stderr + done.stdout
    assert "tuner:***@127.0.0.1" in line and "cannot open storage" in line
    assert "driver" not in line  # psycopg2 is installed: a plain postgresql:// URL uses it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]  # nothing written


def test_a_patience_that_is_not_a_duration_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    monkeypatch.setenv("AUTOTUNE_STORAGE_PATIENCE_S", "forever")
    done = autotune(tmp_path, *SEARCH)
    assert "AUTOTUNE_STORAGE_PATIENCE_S='forever'" in one_error_line(done.stderr)
    assert done.returncode == 2
    assert not (tmp_path / "studies").exists()


def foreign_file(folder: Path, kind: str) -> Path:
    (folder / "studies").mkdir()
    path = folder / "studies" / "autotune.db"
    if kind == "not a database":
        path.write_bytes(b"notes of mine, not a database\n" * 200)
    else:
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
            db.execute("INSERT INTO invoices (total) VALUES (12.5)")
        db.close()
    return path


@pytest.mark.parametrize("kind", ["not a database", "another program's database"])
@pytest.mark.parametrize("command", [SEARCH, ["show", "--study", "tiny"]])
def test_a_foreign_studies_file_is_refused_and_left_as_it_was(
    tmp_path: Path, kind: str, command: list[str]
) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    path = foreign_file(tmp_path, kind)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    done = autotune(tmp_path, *command)
    line = one_error_line(done.stderr)
    assert done.returncode == 1
    assert str(Path("studies/autotune.db")) in line and kind in line
    assert "--storage" in line  # what to do
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in (tmp_path / "studies").iterdir()) == ["autotune.db"]


@pytest.mark.postgres
def test_a_plain_postgresql_url_opens_with_the_driver_the_postgres_extra_installs(
    postgres_url: str,
) -> None:
    """SQLAlchemy 2.1 reads postgresql:// as psycopg 3; the extra installs psycopg2."""
    plain = "postgresql://" + postgres_url.split("://", 1)[1]
    storage = open_storage(plain)
    assert storage.engine.dialect.driver == "psycopg2"
    storage.get_all_studies()  # and it answers


@pytest.mark.parametrize("kind", ["notes", "a SQLite database"])
def test_a_journal_path_to_a_file_that_is_not_a_journal_is_refused_and_left_as_it_was(
    tmp_path: Path, kind: str
) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    (tmp_path / "shared").mkdir()
    path = tmp_path / "shared" / "studies.log"
    if kind == "notes":
        path.write_bytes(b"notes of mine, not a journal\n" * 200)
    else:
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE version_info (version_info_id INTEGER PRIMARY KEY)")
        db.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    done = autotune(tmp_path, *SEARCH, "--storage", str(path))
    line = one_error_line(done.stderr)
    assert done.returncode == 1
    if kind == "notes":
        assert "not an Optuna journal file" in line and "--storage" in line
    else:
        assert f"pass --storage sqlite:///{path}" in line
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared", "tiny"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["studies.log"]


@pytest.mark.parametrize("url", ["sqlite:///{}/studies.db", "{}/studies.log"])
def test_a_review_of_a_storage_file_that_is_not_there_creates_none(
    tmp_path: Path, url: str
) -> None:
    done = autotune(tmp_path, "show", "--study", "tiny", "--storage", url.format(tmp_path))
    assert "does not exist; run `autotune search` first" in one_error_line(done.stderr)
    assert done.returncode == 1
    assert list(tmp_path.iterdir()) == []
