"""Where studies live by default, and the names derived from the model."""

from __future__ import annotations

import re
from pathlib import Path

from autotune.core.errors import UsageError

DEFAULT_STUDIES = Path("studies")
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def default_study_name(model: str) -> str:
    """A path-safe name from the model's last component ('study' when none is left)."""
    tail = Path(model.rstrip("/")).name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", tail).strip(".-_")
    return name if _SAFE.fullmatch(name) else "study"


def check_study_name(name: str) -> str:
    """A study name is a folder name under studies/: letters, digits, '.', '_', '-'."""
    if not _SAFE.fullmatch(name) or name in (".", ".."):
        raise UsageError(
            f"--study {name!r} is not a usable name: use letters, digits, '.', '_' and '-' "
            "(at most 128, starting with a letter or digit); it names a folder under studies/"
        )
    return name


def default_storage(studies_dir: Path) -> str:
    return f"sqlite:///{studies_dir}/autotune.db"
