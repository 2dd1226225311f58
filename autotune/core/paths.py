"""Where studies live by default, and the default names derived from the model."""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_STUDIES = Path("studies")


def default_study_name(model: str) -> str:
    tail = Path(model.rstrip("/")).name or "study"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", tail)


def default_storage(studies_dir: Path) -> str:
    return f"sqlite:///{studies_dir}/autotune.db"
