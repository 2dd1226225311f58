"""Where studies live by default, and the names derived from the model."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
from collections.abc import Iterator
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


def storage_key(url: str) -> str:
    """A short, password-free identity of a storage URL."""
    bare = re.sub(r"(://[^:/@]*):[^@]*@", r"\1@", url)
    return hashlib.sha256(bare.encode()).hexdigest()[:8]


def study_folder(studies_dir: Path, name: str, url: str) -> Path:
    """Where a study's trials, data and logs live: `studies/<name>` for the default
    storage, `studies/<name>-<storage key>` for any other, so the same study name in two
    storages never shares (or overwrites) a folder."""
    if url == default_storage(studies_dir):
        return studies_dir / name
    return studies_dir / f"{name}-{storage_key(url)}"


def claim_folder(folder: Path, name: str, url: str, *, write: bool = True) -> None:
    """Mark the folder as this study's; refuse one that belongs to another study.
    `write=False` only checks (before anything is written)."""
    owner = f"{name} {storage_key(url)}"
    marker = folder / "STUDY"
    try:  # bytes a person or a tool left there are shown, not decoded strictly
        found = " ".join(marker.read_bytes().decode("utf-8", "replace").split())[:100]
    except FileNotFoundError:
        if write:
            folder.mkdir(parents=True, exist_ok=True)
            marker.write_text(owner + "\n", encoding="utf-8")
        return
    if found != owner:
        raise UsageError(
            f"{folder} holds the files of another study ({found}); pass another --study"
        )


_SEARCHING = "SEARCHING"  # SEARCHING.<host>.<pid>: a search of this study is running


@contextlib.contextmanager
def searching(folder: Path) -> Iterator[None]:
    """Mark the study's folder while this process searches it, for `export` to say that
    what it wrote is the best so far. A marker a killed search left behind
    is ignored once its process is gone."""
    marker = folder / f"{_SEARCHING}.{socket.gethostname()}.{os.getpid()}"
    try:
        marker.touch()
    except OSError:
        pass  # only a courtesy to the other commands: never a reason to stop the search
    try:
        yield
    finally:
        marker.unlink(missing_ok=True)


def searches_running(folder: Path) -> list[str]:
    """The searches running on this study now ("pid N", or "pid N on HOST" elsewhere,
    which cannot be checked from here)."""
    here = socket.gethostname()
    found = []
    for marker in sorted(folder.glob(f"{_SEARCHING}.*")):
        host, _, pid = marker.name.removeprefix(f"{_SEARCHING}.").rpartition(".")
        if not pid.isdigit():
            continue
        if host != here:
            found.append(f"pid {pid} on {host}")
        elif pid_alive(int(pid)):
            found.append(f"pid {pid}")
    return found


def pid_alive(pid: int) -> bool:
    """A process of this pid exists on this machine (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
