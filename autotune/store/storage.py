"""Opening an Optuna storage: one place for the URL, its errors and its secrets.

A URL opens an RDB storage (SQLite, PostgreSQL, MySQL); a plain file path opens a journal
file (Optuna's `JournalFileBackend`), for clusters whose workers share a filesystem but
no database server. optuna-dashboard reads both the same way."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sqlite3
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from autotune.core.errors import StudyError, UsageError

HEARTBEAT_ENV = "AUTOTUNE_HEARTBEAT_S"
PATIENCE_ENV = "AUTOTUNE_STORAGE_PATIENCE_S"
STORAGE_ENV = "AUTOTUNE_STORAGE"  # a storage URL kept out of `ps` and shell history
_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")  # user:PASSWORD@ in a URL


def heartbeat_s() -> int:
    """How often a searching process records its running trial's heartbeat (seconds);
    a trial whose heartbeat is older than three intervals belongs to a dead worker."""
    text = os.environ.get(HEARTBEAT_ENV, "10")
    try:
        value = int(text)
    except ValueError:
        raise UsageError(
            f"{HEARTBEAT_ENV}={text!r} is not a whole number of seconds; unset it or set e.g. 10"
        ) from None
    return max(1, value)


def patience_s() -> float:
    """How long an unreachable storage is waited for before the search stops (seconds)."""
    text = os.environ.get(PATIENCE_ENV, "")
    try:
        value = float(text or 60)
    except ValueError:
        value = -1.0
    if not 0 <= value < 10**7:
        raise UsageError(
            f"{PATIENCE_ENV}={text!r} is not a number of seconds; unset it (a minute) or "
            "set e.g. 600 to wait ten minutes for the storage to come back"
        )
    return value


def quiet_optuna() -> None:
    """Optuna's per-trial log lines and experimental warnings off; called when a study is
    opened (never at import: importing autotune changes nothing global)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # We record heartbeats ourselves around each probe (ask/tell, not Study.optimize).
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")


def mask(url: str) -> str:
    """The URL with any password replaced by ***, for messages and logs."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy can parse: mask user:password@ by hand
        return _PASSWORD.sub(r"\1***@", url)


def is_journal(url: str) -> bool:
    """A plain path, not a URL: a journal file."""
    return "://" not in url


def storage_file(url: str) -> Path | None:
    """The file a SQLite or journal storage keeps its studies in; None for a server."""
    if is_journal(url):
        return Path(url)
    path = url.removeprefix("sqlite:///")
    return Path(path) if path != url else None


def open_storage(url: str) -> BaseStorage:
    """An RDB storage (SQLite, PostgreSQL, MySQL) with heartbeats for running trials, or
    a journal file (its heartbeats are trial attributes: see `compat`)."""
    if is_journal(url):
        return _open_journal(url)
    engine: dict[str, Any] = {}
    if url.startswith("sqlite"):
        # Several workers on one SQLite file wait for each other's writes.
        engine = {"connect_args": {"timeout": 60}}
    elif "://" in url:
        engine = {"pool_pre_ping": True}
    _refuse_foreign_sqlite(url)
    given, url = url, _installed_postgres_driver(url)  # messages name the URL given
    beat = heartbeat_s()
    patience_s()  # a bad value is refused before anything is written, not at an outage
    for attempt in range(3):
        try:
            return RDBStorage(
                url,
                engine_kwargs=engine,
                heartbeat_interval=beat,
                grace_period=3 * beat,
            )
        except ImportError as exc:
            driver = given.split(":", 1)[0]
            raise StudyError(
                f"cannot open storage {mask(given)!r}: the driver for {driver} is not installed "
                f"({first_line(exc)}); for PostgreSQL: pip install 'autotune[postgres]'"
            ) from None
        except sqlalchemy.exc.SQLAlchemyError as exc:
            # Two workers creating the tables of a new storage at once: one loses the race.
            racing = any(
                sign in str(exc)
                for sign in ("already exists", "duplicate key", "UNIQUE constraint failed")
            )
            if not racing or attempt == 2:
                raise StudyError(
                    f"cannot open storage {mask(given)!r}: {first_line(exc)}"
                ) from None
            time.sleep(0.5 + attempt)
        except Exception as exc:
            raise StudyError(f"cannot open storage {mask(given)!r}: {first_line(exc)}") from None
    raise AssertionError("unreachable")


def _open_journal(path: str) -> JournalStorage:
    """A journal file, created when it is not there. Its writes take turns through
    Optuna's symlink lock (NFS keeps link() atomic), which another worker takes over when
    a killed worker left it behind for 30 s; no fcntl() lock, which many NFS mounts lack."""
    heartbeat_s()  # bad values are refused before anything is written, as for a database
    patience_s()
    _refuse_foreign_journal(path)
    try:
        return JournalStorage(JournalFileBackend(path))
    except OSError as exc:
        raise StudyError(
            f"cannot open storage {path!r}: {exc.strerror or first_line(exc)}; pass --storage "
            "with a file in a folder this user can write"
        ) from None
    except Exception as exc:  # a journal another program or version wrote
        raise StudyError(
            f"cannot open storage {path!r}: it is not an Optuna journal this version can "
            f"read ({first_line(exc)}); move it away, or pass --storage with another file"
        ) from None


def _refuse_foreign_journal(path: str) -> None:
    """A file that is not a journal is refused before Optuna appends to it: a SQLite
    database (named with sqlite:/// instead), or another program's file."""
    try:
        with open(path, "rb") as file:
            head = file.read(4096)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StudyError(f"cannot open storage {path!r}: {exc.strerror}") from None
    if head.startswith(b"SQLite format 3\x00"):
        raise StudyError(
            f"cannot open storage {path!r}: it is a SQLite database, not a journal file; "
            f"pass --storage sqlite:///{path}"
        )
    first = head.split(b"\n", 1)[0]
    if head and not (first.startswith(b"{") and b'"op_code"' in first):
        raise StudyError(
            f"cannot open storage {path!r}: it is not an Optuna journal file; autotune leaves "
            "it as it is: pass --storage with another file (a new one is created)"
        )


def _refuse_foreign_sqlite(url: str) -> None:
    """A SQLite file that is not a database, or another program's database, is refused
    before Optuna opens it: Optuna would add its tables to another program's file."""
    path = Path(url.removeprefix("sqlite:///"))
    if path == Path(url) or not path.is_file() or path.stat().st_size == 0:
        return  # not SQLite, in memory, or a file Optuna is to create
    try:
        with contextlib.closing(
            sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        ) as db:
            tables = {
                row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
    except sqlite3.OperationalError:
        return  # locked or briefly unreadable: opening it retries and says so
    except sqlite3.DatabaseError as exc:
        raise StudyError(
            f"cannot open storage {url!r}: {path} is not a database ({exc}); move it away, "
            "or pass --storage with another file"
        ) from None
    if tables and "version_info" not in tables:
        shown = ", ".join(sorted(tables)[:5])
        raise StudyError(
            f"cannot open storage {url!r}: {path} is another program's database (tables: "
            f"{shown}), not an Optuna storage; autotune leaves it as it is: pass --storage "
            "with another file"
        )


def _installed_postgres_driver(url: str) -> str:
    """`postgresql://` names SQLAlchemy's default driver (psycopg 3 from SQLAlchemy 2.1,
    psycopg2 before): with only psycopg2 installed (the postgres extra), use it."""
    if not url.startswith("postgresql://"):
        return url
    found = {name for name in ("psycopg", "psycopg2") if importlib.util.find_spec(name)}
    if found == {"psycopg2"}:
        return "postgresql+psycopg2://" + url.removeprefix("postgresql://")
    return url


def first_line(exc: BaseException) -> str:
    """An exception's first line, with any storage password masked."""
    text = str(exc).strip().splitlines()
    line = text[0][:200] if text else type(exc).__name__
    return _PASSWORD.sub(r"\1***@", line)


def serve_dashboard(url: str, *, host: str, port: int) -> None:
    """optuna-dashboard on the storage at `url`, until interrupted (it has no
    authentication: the caller says so before serving off loopback)."""
    from optuna_dashboard import run_server  # its web server: loaded by `dashboard` alone

    run_server(open_storage(url) if is_journal(url) else url, host=host, port=port)


@contextlib.contextmanager
def readable(name: str, url: str, what: str) -> Iterator[None]:
    """Decoding what a study holds: StudyError, naming the study and `what` of it cannot
    be read, where another version (or damage) left it in a shape this one cannot read."""
    try:
        yield
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        why = f"no {exc}" if isinstance(exc, KeyError) else first_line(exc)
        raise StudyError(
            f"study {name!r} in {mask(url)}: {what} cannot be read ({why}); another autotune "
            "version wrote it, or it is damaged: search it under another --study"
        ) from None
