"""`autotune doctor` says each check as it ends: on a GPU the dozen probes take minutes
(an H100 run printed nothing in its first 120 s), and a table only at the end looked hung."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune import cli, doctor
from autotune.core.device import DeviceInfo
from autotune.views.doctor import print_report

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


@pytest.mark.parametrize("slowdown", [1.1, 6.0])
def test_a_cpu_slow_on_subnormal_numbers_is_told_how_to_flush_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], slowdown: float
) -> None:
    """Information, not a failure: the search still holds, but a stand-in's fp32 steps
    (random weights can make subnormals a trained checkpoint does not) and a long run's
    later steps are slower than they need be, and the user can flush them."""
    monkeypatch.setattr(doctor.subnormals, "slowdown", lambda: (slowdown, slowdown, slowdown))
    device = DeviceInfo("cpu", None, "test cpu", 2**30)
    check = doctor.Doctor(device, Path(".")).subnormals()
    assert check.passed is None and f"{slowdown:.1f}x" in check.figures
    assert ("set_flush_denormal(True)" in check.advice) == (slowdown >= doctor.SUBNORMALS_SLOW)
    print_report(doctor.DoctorReport(device, {}, (check,)))
    shown = " ".join(capsys.readouterr().out.split())
    assert ("set_flush_denormal" in shown) == (slowdown >= doctor.SUBNORMALS_SLOW)


def test_a_gpu_does_not_time_subnormal_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor.subnormals, "slowdown", lambda: pytest.fail("timed on a GPU"))
    device = DeviceInfo("cuda", 0, "H100", 80 * 2**30, (9, 0))
    assert doctor.Doctor(device, Path(".")).subnormals().passed is None
