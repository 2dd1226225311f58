"""Writing files so that nothing the user has is lost or loosened, and reading the JSON
that people and other processes wrote."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write a file so that readers see the old content or the new, never half of it.

    A symlink keeps pointing where it did (its target is what gets rewritten), and an
    existing file keeps its mode and owner: a 0600 arguments file holding a token stays
    0600. A new file gets the default mode (umask applies)."""
    write_all_atomic({path: text})


def append_line(path: Path, line: str) -> None:
    """Append one line and flush it to the file: a reader sees every line written before
    the process died."""
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()


def write_all_atomic(texts: dict[Path, str | bytes]) -> None:
    """Write several files that belong together (an export and its sidecar): each is
    written in full beside its target first, and only then are they renamed over their
    targets, so a full disk leaves every old file as it was, not one new beside one old."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in texts.items():
            target = Path(os.path.realpath(path))
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            staged.append((tmp, target))
            _stage(tmp, target, text)
        for tmp, target in staged:
            os.replace(tmp, target)
    except OSError as exc:  # a full disk: name the file, which a bare write does not
        where = exc.filename or (staged[-1][1] if staged else next(iter(texts), ""))
        raise OSError(exc.errno, exc.strerror, str(where)) from None
    finally:
        for tmp, _ in staged:
            if tmp.exists():
                tmp.unlink()


def _stage(tmp: Path, target: Path, text: str | bytes) -> None:
    """`text` written and synced to `tmp`, with `target`'s mode and owner if it exists."""
    try:
        before: os.stat_result | None = target.stat()
    except FileNotFoundError:
        before = None
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if before else 0o666)
    with open(fd, "wb") as handle:
        handle.write(text.encode("utf-8") if isinstance(text, str) else text)
        handle.flush()
        os.fsync(handle.fileno())
    if before is not None:
        os.chmod(tmp, before.st_mode & 0o7777)
        if (before.st_uid, before.st_gid) != (os.getuid(), os.getgid()):
            try:
                os.chown(tmp, before.st_uid, before.st_gid)
            except PermissionError:
                pass  # only root may give a file away; the mode is kept all the same


def parse_json(text: str | bytes) -> Any:
    """The JSON value of `text` (bytes: UTF-8); ValueError saying what is wrong with it
    for anything else, including what `json.loads` raises no ValueError for (nesting
    deeper than it recurses) or says in Python's terms (an integer past the digits
    Python converts)."""
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except RecursionError:
        raise ValueError("nested deeper than can be read") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except ValueError:  # the only other: int()'s limit on the digits it converts
        raise ValueError("a number has more digits than can be read") from None


def read_json(path: Path) -> Any:
    """The JSON value of the file at `path`: OSError when it cannot be read, ValueError
    (what is wrong) when it holds no JSON."""
    return parse_json(path.read_bytes())
