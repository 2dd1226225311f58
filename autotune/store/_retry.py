"""Riding out a storage that goes away for a while (a PostgreSQL restart, a network
blip, a SQLite file another process holds locked): transient errors are retried with
backoff for a stated time ($AUTOTUNE_STORAGE_PATIENCE_S, a minute by default); past it
they are a StudyError the CLI reports in one line."""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

import optuna
import sqlalchemy.exc

from autotune.core.errors import StudyError
from autotune.store.storage import PATIENCE_ENV, first_line, patience_s

P = ParamSpec("P")
R = TypeVar("R")
TRANSIENT = (
    sqlalchemy.exc.OperationalError,  # the server restarted, the connection dropped
    sqlalchemy.exc.InterfaceError,
    optuna.exceptions.StorageInternalError,  # Optuna's wrapper of the above
)
_NOT_TRANSIENT = ("disk is full", "readonly database", "disk I/O error")  # SQLite's
LONGEST_WAIT_S = 30.0
_inside = threading.local()  # a retried call within a retried call: the outer one retries


def _lasting(exc: BaseException) -> str:
    """The cause, when waiting cannot help (a full disk, a read-only file: SQLite's words,
    often wrapped by Optuna): its first line; else ''."""
    seen: BaseException | None = exc
    while seen is not None:
        if any(sign in str(seen) for sign in _NOT_TRANSIENT):
            return first_line(seen)
        seen = seen.__cause__ or seen.__context__
    return ""


def _waits(patience: float) -> Iterator[float]:
    """0.5 s, then twice as long each time (at most 30 s), until `patience` is spent."""
    spent, wait = 0.0, 0.5
    while spent < patience:
        step = min(wait, patience - spent)
        yield step
        spent += step
        wait = min(2 * wait, LONGEST_WAIT_S)


def transient_retry(call: Callable[P, R]) -> Callable[P, R]:
    """Retry `call` on transient storage errors, waiting longer each time."""

    @functools.wraps(call)
    def retried(*args: P.args, **kwargs: P.kwargs) -> R:
        if getattr(_inside, "depth", 0):
            return call(*args, **kwargs)
        patience = patience_s()
        _inside.depth = 1
        try:
            for wait in _waits(patience):
                try:
                    return call(*args, **kwargs)
                except TRANSIENT as exc:
                    if lasting := _lasting(exc):
                        raise StudyError(
                            f"cannot write the storage ({lasting}): free disk space or fix "
                            "its permissions, then rerun the same command to resume"
                        ) from None
                    print(
                        f"storage unreachable ({first_line(exc)[:80]}); retrying in "
                        f"{wait:.1f} s (for up to {patience:.0f} s: {PATIENCE_ENV})",
                        file=sys.stderr,
                    )
                    time.sleep(wait)
            try:
                return call(*args, **kwargs)
            except TRANSIENT as exc:
                raise StudyError(
                    f"the storage was unreachable for {patience:.0f} s ({first_line(exc)}); "
                    f"the study is kept: rerun the same command to resume once it answers "
                    f"(or set {PATIENCE_ENV} to wait longer)"
                ) from None
        finally:
            _inside.depth = 0

    return retried
