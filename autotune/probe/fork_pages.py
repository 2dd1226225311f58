"""The library pages a probe forked from the fork server has not touched yet.

A forked child does not count the libraries' pages in its resident set until it touches
them (fork does not copy the page tables of file mappings nobody wrote to), while a fresh
training process, having loaded the libraries itself, counts every page it touched
while importing them. The server notes which of its file-backed pages are resident
(`remember`); a child adds back those it has not touched itself (`untouched_bytes`), so
a config's peak does not depend on how its probe was launched.

Pages are compared one by one, through /proc/self/pagemap: comparing per-library totals
would let the pages a child touched in training hide as many of the server's (measured:
a forked peak 7% below a fresh process's on a tiny model, 10% on a loaded machine).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

_PAGE = os.sysconf("SC_PAGE_SIZE")
_PRESENT = np.uint64(1 << 63)  # pagemap: the page is mapped in this process

# The fork server's resident file-backed pages: one bool per page of each mapping, by
# the mapping's address range. A forked child inherits it; empty in a fresh process.
_SERVER: dict[tuple[int, int], np.ndarray] = {}


def remember() -> None:
    """In the fork server, after its imports: note the library pages it has resident."""
    _SERVER.clear()
    try:
        _SERVER.update(resident_file_pages())
    except (OSError, ValueError):  # no pagemap (a sandboxed /proc): peaks go uncorrected
        _SERVER.clear()


def untouched_bytes() -> int:
    """Bytes of the server's resident library pages this forked child has not touched;
    0 in a process not forked from the server."""
    if not _SERVER:
        return 0
    try:
        with open("/proc/self/pagemap", "rb") as pagemap:
            pages = sum(
                int(np.count_nonzero(server & ~_present(pagemap, *where)))
                for where, server in _SERVER.items()
            )
    except (OSError, ValueError):  # the probe's result matters more than this correction
        return 0
    return pages * _PAGE


def resident_file_pages() -> dict[tuple[int, int], np.ndarray]:
    """Which pages of each file-backed mapping (shared libraries, mapped files) are
    mapped in this process, by the mapping's (start, end) address."""
    with open("/proc/self/pagemap", "rb") as pagemap:
        return {where: _present(pagemap, *where) for where in _file_mappings()}


def _file_mappings() -> list[tuple[int, int]]:
    found = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()  # range, perms, offset, device, inode[, path]
        # private file mappings (libraries); not devices or shared memory, whose pages
        # the resident set does not count alike
        if (
            len(fields) > 5
            and fields[4] != "0"
            and fields[1].endswith("p")
            and not (fields[5].startswith("/dev/") or fields[5].startswith("/memfd:"))
        ):
            start, end = (int(a, 16) for a in fields[0].split("-"))
            found.append((start, end))
    return found


def _present(pagemap: BinaryIO, start: int, end: int) -> np.ndarray:
    """One bool per page from start to end: whether it is mapped in this process."""
    pagemap.seek(start // _PAGE * 8)  # one 64-bit entry per page
    entries = np.frombuffer(pagemap.read((end - start) // _PAGE * 8), dtype=np.uint64)
    present: np.ndarray = (entries & _PRESENT) != 0
    return present
