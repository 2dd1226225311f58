"""Writing files so that nothing the user has is lost or loosened."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write a file so that readers see the old content or the new, never half of it.

    A symlink keeps pointing where it did (its target is what gets rewritten), and an
    existing file keeps its mode and owner: a 0600 arguments file holding a token stays
    0600. A new file gets the default mode (umask applies)."""
    target = Path(os.path.realpath(path))
    try:
        before: os.stat_result | None = target.stat()
    except FileNotFoundError:
        before = None
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if before else 0o666)
        with open(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if before is not None:
            os.chmod(tmp, before.st_mode & 0o7777)
            if (before.st_uid, before.st_gid) != (os.getuid(), os.getgid()):
                try:
                    os.chown(tmp, before.st_uid, before.st_gid)
                except PermissionError:
                    pass  # only root may give a file away; the mode is kept all the same
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
