"""`autotune doctor`: the checks as a table, versions and devices for bug reports."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autotune.doctor import Check, DoctorReport

MARK = {True: Text("pass", "green"), False: Text("FAIL", "red"), None: Text("info", "dim")}


def progress_line(check: Check) -> str:
    """One check as it ends, for stderr while the rest run."""
    return f"{MARK[check.passed].plain:<4} {check.name}: {check.figures}"


def print_report(report: DoctorReport, fmt: str = "table") -> None:
    if fmt == "json":
        print(json.dumps(as_dict(report), indent=2))
        return
    console = Console(highlight=False, width=160, markup=False)
    d = report.device
    console.print(
        f"device: {d.kind} {d.name}, {d.total_memory_bytes / 2**30:.1f} GiB"
        + (f", compute capability {d.capability}" if d.capability else "")
    )
    console.print("versions: " + ", ".join(f"{k} {v}" for k, v in report.versions.items()))
    table = Table(title="checks", title_justify="left")
    for column in ("", "check", "figures", "what to do"):
        table.add_column(column)
    for check in report.checks:
        table.add_row(
            MARK[check.passed],
            check.name,
            check.figures,
            check.advice if check.passed is not True else "",
        )
    console.print(table)
    failed = report.failed
    console.print(f"{len(failed)} check(s) failed" if failed else "every check passed")


def as_dict(report: DoctorReport) -> dict[str, Any]:
    return {
        "device": {
            "kind": str(report.device.kind),
            "name": report.device.name,
            "total_memory_bytes": report.device.total_memory_bytes,
        },
        "versions": report.versions,
        "checks": [
            {"name": c.name, "passed": c.passed, "figures": c.figures, "advice": c.advice}
            for c in report.checks
        ],
    }
