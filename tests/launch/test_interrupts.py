"""Ctrl-C, SIGTERM and SIGKILL of the search itself: the study stays consistent, no
process is left behind, and the same command resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import PLAIN_LEVERS, TINY_GPT2, write_model

pytestmark = pytest.mark.slow

ARGV = [
    "search",
    "--model",
    "./tiny",
    "--device",
    "cpu",
    *PLAIN_LEVERS,
    "--global-batch-size",
    "16",
    "--seq-len",
    "64",
    "--precisions",
    "fp32",
    "--optimizers",
    "adamw_torch,adafactor",
    "--checkpointing",
    "off",
    "--max-trials",
    "3",
    "--warmup-steps",
    "1",
    "--measure-steps",
    "40",  # each probe lasts a few seconds: long enough to be caught running
    "--confirm-top",
    "0",
    "--quiet",
]


def start(work: Path) -> subprocess.Popen[str]:
    """The search as a terminal starts it. SIGINT back to its default first: a test run
    started as a background job of a non-interactive shell inherits SIGINT ignored, and
    Python then installs no KeyboardInterrupt handler (the search would not see Ctrl-C)."""
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *ARGV],
        cwd=work,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def probes_running(work: Path, *, trials_only: bool = False) -> list[int]:
    """PIDs of probe children (or fork servers) working in this test's directory.

    A trial's child leads its own session; with `trials_only` the server is left out.
    """
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cwd = os.readlink(proc / "cwd")
        except (OSError, IndexError):
            continue
        state, session = stat[0], int(stat[3])
        ours = "autotune.probe" in cmdline or "autotune.launch.forkserver" in cmdline
        if trials_only and session != int(proc.name):
            continue
        if ours and cwd == str(work) and state not in "ZX":
            found.append(int(proc.name))
    return found


def wait_for_second_probe(work: Path, search: subprocess.Popen[str]) -> None:
    """Wait until trial 0 is recorded and the next probe is running."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        trials = work / "studies/tiny/trials"
        later = trials.is_dir() and any(d.name != "0" for d in trials.iterdir())
        if later and probes_running(work, trials_only=True):
            return
        assert search.poll() is None, search.communicate()
        time.sleep(0.2)
    raise AssertionError("the search never reached its second probe")


def study(work: Path) -> optuna.Study:
    return optuna.load_study(study_name="tiny", storage=f"sqlite:///{work}/studies/autotune.db")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_fails_the_running_trial_and_the_rerun_finishes(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    search = start(tmp_path)
    wait_for_second_probe(tmp_path, search)
    search.send_signal(sig)
    _, err = search.communicate(timeout=60)
    assert search.returncode == code
    assert "rerun to resume" in err and "Traceback" not in err
    assert probes_running(tmp_path) == []
    states = {t.number: t.state for t in study(tmp_path).get_trials()}
    assert optuna.trial.TrialState.RUNNING not in states.values()
    assert states[0] == optuna.trial.TrialState.COMPLETE
    interrupted = [t for t in study(tmp_path).get_trials() if t.state.name == "FAIL"]
    assert interrupted and interrupted[0].user_attrs["reason"].startswith("interrupted")
    resumed = start(tmp_path)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    measured = [t for t in study(tmp_path).get_trials() if "result" in t.user_attrs]
    assert len([t for t in measured if t.user_attrs["outcome"] != "skipped"]) == 3
    assert any(t.params == interrupted[0].params for t in measured)


def test_sigkill_of_the_search_kills_the_probe_and_the_rerun_recovers(tmp_path: Path) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    search = start(tmp_path)
    wait_for_second_probe(tmp_path, search)
    search.kill()
    search.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while probes_running(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert probes_running(tmp_path) == []
    running = [t for t in study(tmp_path).get_trials() if t.state.name == "RUNNING"]
    assert len(running) == 1
    resumed = start(tmp_path)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    trials = study(tmp_path).get_trials()
    stale = trials[running[0].number]
    assert stale.state.name == "FAIL" and "re-queued" in stale.user_attrs["reason"]
    assert trials[0].user_attrs["outcome"] == "ok"  # measured before the kill: kept
    assert any(
        t.params == stale.params and t.user_attrs.get("outcome")
        for t in trials[1:]
        if t.number != stale.number
    )


def test_unwritable_trial_directory_stops_cleanly_and_resumes(tmp_path: Path) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    (tmp_path / "studies" / "tiny").mkdir(parents=True)
    blocker = tmp_path / "studies" / "tiny" / "trials"
    blocker.write_text("not a directory")
    argv = [a if a != "3" else "1" for a in ARGV]  # one probe is enough here
    first = subprocess.run(
        [sys.executable, "-m", "autotune", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    assert first.returncode == 1
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot write trial files in studies/tiny/trials/0")
    (trial,) = [t for t in study(tmp_path).get_trials() if t.state.name != "WAITING"]
    assert trial.state.name == "FAIL" and "cannot write trial files" in trial.user_attrs["reason"]
    blocker.unlink()
    second = subprocess.run(
        [sys.executable, "-m", "autotune", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    assert second.returncode == 0, second.stderr
    outcomes = [t.user_attrs.get("outcome") for t in study(tmp_path).get_trials()]
    assert [o for o in outcomes if o] == ["error", "ok"]
