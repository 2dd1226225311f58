"""A forked probe counts the library pages it inherited untouched, as a fresh process
that loaded the libraries itself would."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from autotune.probe import fork_pages

SIZE = 8 * 2**20


def _in_child(report: Path, mapped: mmap.mmap) -> None:
    """In a forked child: the untouched bytes before and after reading the mapping."""
    before = fork_pages.untouched_bytes()
    checksum = sum(mapped[i] for i in range(0, SIZE, mmap.PAGESIZE))  # touch every page
    after = fork_pages.untouched_bytes()
    report.write_text(f"{before} {after} {checksum}")


def test_a_forked_child_counts_the_mapped_pages_it_has_not_touched(tmp_path: Path) -> None:
    library = tmp_path / "library.bin"
    library.write_bytes(os.urandom(SIZE))
    with library.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) as m:
        sum(m[i] for i in range(0, SIZE, mmap.PAGESIZE))  # the "server" has it resident
        assert fork_pages.untouched_bytes() == 0  # nothing remembered: a fresh process
        fork_pages.remember()
        try:
            assert (
                fork_pages.untouched_bytes() < SIZE
            )  # the server lacks none of its own (bar a reclaim)
            report = tmp_path / "child.txt"
            pid = os.fork()
            if pid == 0:
                try:
                    _in_child(report, m)
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
        finally:
            fork_pages._SERVER.clear()
    before, after, _ = (int(n) for n in report.read_text().split())
    assert before >= SIZE  # the whole mapping, untouched by the child
    assert before - after >= SIZE  # touched: now the child's own resident set counts it
