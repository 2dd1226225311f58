"""One exception hierarchy; the CLI turns each into a one-line message and an exit code."""

from __future__ import annotations

from types import FrameType


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so cleanup runs as for Ctrl-C."""


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler: unwind like Ctrl-C (the running trial is failed and re-queued)."""
    raise Terminated()


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose. Exit code 1."""

    exit_code = 1


class UsageError(AutotuneError):
    """The user asked for something that cannot be done as asked. Exit code 2."""

    exit_code = 2


class ModelNotFoundError(UsageError):
    """--model names nothing in any place we look."""


class ModelConfigError(UsageError):
    """The model's config.json exists but cannot be used."""


class SpaceError(UsageError):
    """The search space is empty or cannot keep the global batch."""


class StudyError(AutotuneError):
    """The study storage cannot be used, or holds a different search."""


class NoFitError(AutotuneError):
    """Every configuration probed ran out of memory or failed."""


class TrialFilesError(AutotuneError):
    """A trial's directory cannot be created or written (permissions, a full disk)."""


class ExportError(AutotuneError):
    """The best configuration cannot be written as TrainingArguments JSON."""


class LaunchError(AutotuneError):
    """A probe could not be started (the fork server died or did not answer)."""
