"""Riding out a storage that goes away for a while (a PostgreSQL restart, a network
blip): transient errors are retried with backoff; after about a minute they are a
StudyError the CLI reports in one line."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import optuna
import sqlalchemy.exc

from autotune.core.errors import StudyError
from autotune.store.storage import first_line

P = ParamSpec("P")
R = TypeVar("R")
TRANSIENT = (
    sqlalchemy.exc.OperationalError,  # the server restarted, the connection dropped
    sqlalchemy.exc.InterfaceError,
    optuna.exceptions.StorageInternalError,  # Optuna's wrapper of the above
)
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)


def transient_retry(call: Callable[P, R]) -> Callable[P, R]:
    """Retry `call` on transient storage errors, waiting longer each time."""

    @functools.wraps(call)
    def retried(*args: P.args, **kwargs: P.kwargs) -> R:
        for wait in BACKOFF_S:
            try:
                return call(*args, **kwargs)
            except TRANSIENT as exc:
                print(
                    f"storage unreachable ({first_line(exc)[:80]}); retrying in {wait:.0f} s",
                    file=sys.stderr,
                )
                time.sleep(wait)
        try:
            return call(*args, **kwargs)
        except TRANSIENT as exc:
            raise StudyError(
                f"the storage kept failing for {sum(BACKOFF_S):.0f} s ({first_line(exc)}); "
                "the study is kept: rerun to resume once it answers"
            ) from None

    return retried
