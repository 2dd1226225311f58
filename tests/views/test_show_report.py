"""show, report and dashboard on a real study, through the real CLI."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import autotune

from autotune.core.units import format_size

pytestmark = pytest.mark.slow
Study = tuple[Path, list[str], str]


def test_show_lists_every_trial_best_first_with_reasons(searched_study: Study) -> None:
    work, _, _ = searched_study
    done = autotune(work, "show", "--study", "tiny")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    body = [ln for ln in lines if "│" in ln and "batch " in ln]
    assert "*" in body[0].split("│")[1]  # the selected trial comes first
    summary = json.loads((work / "studies" / "tiny.best.summary.json").read_text())
    limit = format_size(summary["fit_limit_bytes"])
    assert any("OOM at" in ln and f"of {limit}" in ln for ln in body)
    # 8x4 and 16x2, fp32 and bf16, measured (16x2 within the limit or over it); 32x1 out
    # of memory (the other precision's 32x1 a row of its own where it was probed, none
    # where an OOM implied it)
    assert len(body) == len([ln for ln in body if ln.split("│")[3].strip()]) >= 5


def test_show_json_for_scripts(searched_study: Study) -> None:
    work, _, _ = searched_study
    done = autotune(work, "show", "--study", "tiny", "--format", "json")
    data = json.loads(done.stdout)
    trials = data["trials"]
    assert trials[0]["best"] and trials[0]["outcome"] == "ok"
    assert trials[0]["training_arguments"]["per_device_train_batch_size"] in (8, 16)
    ooms = [t for t in trials if t["outcome"] == "oom"]
    assert ooms and all(t["why"].startswith("OOM at") for t in ooms)
    assert all(t["why"] for t in trials if t["outcome"] != "ok")  # every other row says why


def test_every_figure_show_gives_is_within_its_physical_range(searched_study: Study) -> None:
    """fp32 and bf16 trials of a real study: no MFU above 100% (the peak is measured with
    the kernel training uses), no negative spread, a budget overrun only with its reason."""
    work, _, _ = searched_study
    trials = json.loads(autotune(work, "show", "--study", "tiny", "--format", "json").stdout)
    ok = [t for t in trials["trials"] if t["outcome"] == "ok"]
    assert {t["config"].split()[2] for t in ok} == {"fp32", "bf16"}
    for row in ok:
        assert row["mfu_pct"] is not None and 0 < row["mfu_pct"] <= 100, row
        assert row["step_time_spread_pct"] >= 0 and row["samples_per_s"] > 0
        assert 0 < row["budget_used_pct"] <= 100 or row["why"], row
        assert row["padding_pct"] is None or 0 <= row["padding_pct"] <= 100


def test_report_writes_html_with_its_charts_and_the_hand_off(searched_study: Study) -> None:
    work, _, _ = searched_study
    done = autotune(work, "report", "--study", "tiny", "--output-dir", "out")
    assert done.returncode == 0, done.stderr
    page = (work / "out" / "tiny.report.html").read_text()
    assert page.count("data:image/png;base64,") == 3
    assert "Selected: trial" in page
    # What the winner changes against the user's recipe (here the plain default), by kind.
    assert "What changed against your recipe" in page or "your recipe is the winner" in page
    assert "<th>parity</th>" in page
    assert "autotune export --study tiny --merge-into your_args.json" in page
    assert "--per_device_train_batch_size 8" in page  # the flags of the winner
    assert "selected" in page and ("% slower" in page or "tie:" in page)  # every row's note
    for name in ("tiny.ranked.png", "tiny.tradeoff.png", "tiny.by-batch.png"):
        png = (work / "out" / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def test_dashboard_serves_the_study_and_its_trials(searched_study: Study) -> None:
    work, _, _ = searched_study
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "autotune", "dashboard", "--study", "tiny", "--port", str(port)],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                studies = get_json(f"{base}/api/studies")
                break
            except OSError:
                assert server.poll() is None, server.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.3)
        (study,) = [s for s in studies["study_summaries"] if s["study_name"] == "tiny"]  # type: ignore[index]
        detail = get_json(f"{base}/api/studies/{study['study_id']}")
        trials = detail["trials"]
        assert len(trials) >= 5  # type: ignore[arg-type]
        params = {p["name"] for t in trials for p in t["params"]}  # type: ignore[index,union-attr]
        assert {"per_device_train_batch_size", "optim", "activation_checkpointing"} <= params
        attrs = {a["key"] for t in trials for a in t["user_attrs"]}  # type: ignore[index,union-attr]
        assert {"outcome", "samples_per_s", "peak_memory_gib", "reason"} <= attrs
        assert "autotune: ./tiny" in json.dumps(detail)  # the study's note
    finally:
        server.terminate()
        server.communicate(timeout=30)


def test_show_prints_a_reason_with_brackets_as_it_reads(capsys: pytest.CaptureFixture[str]) -> None:
    from helpers import SPEC

    from autotune.views.show import TrialRow, print_table

    why = "OSError: [Errno 2] no file [/tmp/data/x.json]"
    row = TrialRow(
        trial=3,
        best=False,
        config="batch 16x1 fp32",
        training_arguments={},
        outcome="error",
        samples_per_s=None,
        tokens_per_s=None,
        peak_memory_gib=None,
        budget_used_pct=None,
        step_time_spread_pct=None,
        mfu_pct=None,
        why=why,
    )
    print_table([row], SPEC, "s")
    assert why in capsys.readouterr().out


def test_the_table_says_which_step_time_ranks_and_which_its_columns_show(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The columns are at the median step, the * chosen by the quiet step: without saying
    so, a row showing more samples/s than the * reads as a wrong choice."""
    from helpers import SPEC

    from autotune.core.enums import Objective
    from autotune.views.show import print_table

    print_table([], dataclasses.replace(SPEC, train_steps=300), "s")
    out = " ".join(capsys.readouterr().out.split())
    assert "samples/s, tokens/s: at the median step" in out
    assert "ranks first by the quiet step" in out
    assert "selected by time to finish 300 steps" in out
    assert "at the measured median" not in out  # what selection never used
    print_table([], SPEC, "s", Objective.EFFICIENCY)
    assert "quiet step" not in capsys.readouterr().out  # per GiB: another rule
