"""Opening an Optuna RDB storage: one place for the URL, its errors and its secrets."""

from __future__ import annotations

import os
import re
import time
import warnings
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.storages import RDBStorage

from autotune.core.errors import StudyError, UsageError

HEARTBEAT_ENV = "AUTOTUNE_HEARTBEAT_S"
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


def open_storage(url: str) -> RDBStorage:
    """An RDB storage (SQLite, PostgreSQL, MySQL) with heartbeats for running trials."""
    engine: dict[str, Any] = {}
    if url.startswith("sqlite"):
        # Several workers on one SQLite file wait for each other's writes.
        engine = {"connect_args": {"timeout": 60}}
    elif "://" in url:
        engine = {"pool_pre_ping": True}
    beat = heartbeat_s()
    for attempt in range(3):
        try:
            return RDBStorage(
                url,
                engine_kwargs=engine,
                heartbeat_interval=beat,
                grace_period=3 * beat,
            )
        except ImportError as exc:
            driver = url.split(":", 1)[0]
            raise StudyError(
                f"cannot open storage {mask(url)!r}: the driver for {driver} is not installed "
                f"({first_line(exc)}); for PostgreSQL: pip install psycopg2-binary"
            ) from None
        except sqlalchemy.exc.SQLAlchemyError as exc:
            # Two workers creating the tables of a new storage at once: one loses the race.
            racing = any(
                sign in str(exc)
                for sign in ("already exists", "duplicate key", "UNIQUE constraint failed")
            )
            if not racing or attempt == 2:
                raise StudyError(f"cannot open storage {mask(url)!r}: {first_line(exc)}") from None
            time.sleep(0.5 + attempt)
        except Exception as exc:
            raise StudyError(f"cannot open storage {mask(url)!r}: {first_line(exc)}") from None
    raise AssertionError("unreachable")


def first_line(exc: BaseException) -> str:
    """An exception's first line, with any storage password masked."""
    text = str(exc).strip().splitlines()
    line = text[0][:200] if text else type(exc).__name__
    return _PASSWORD.sub(r"\1***@", line)
