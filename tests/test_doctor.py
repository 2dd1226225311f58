"""`autotune doctor` says each check as it ends: on a GPU the dozen probes take minutes
(an H100 run printed nothing in its first 120 s), and a table only at the end looked hung."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from autotune import cli, doctor
from autotune.core.device import DeviceInfo

CHECKS = (doctor.Check("first", True, "fine"), doctor.Check("second", False, "broken", "fix it"))


def test_each_check_is_handed_on_as_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []

    def checks(self: doctor.Doctor, optimizers: tuple[str, ...]) -> Iterator[doctor.Check]:
        for check in CHECKS:
            events.append(f"ran {check.name}")
            yield check

    monkeypatch.setattr(doctor.Doctor, "run", checks)
    report = doctor.run_doctor(
        device=DeviceInfo("cpu", None, "test cpu", 2**30),
        optimizers=(),
        versions={},
        on_check=lambda check: events.append(f"said {check.name}"),
    )
    assert events == ["ran first", "said first", "ran second", "said second"]
    assert report.checks == CHECKS and report.failed == [CHECKS[1]]


def test_the_command_says_each_check_on_stderr_and_keeps_json_on_stdout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(doctor.Doctor, "run", lambda self, optimizers: iter(CHECKS))
    done = CliRunner().invoke(cli.cli, ["doctor", "--device", "cpu", "--format", "json"])
    assert done.exit_code == 1  # a check failed
    assert done.stderr.splitlines() == ["pass first: fine", "FAIL second: broken"]
    shown = json.loads(done.stdout)
    assert [c["name"] for c in shown["checks"]] == ["first", "second"]
