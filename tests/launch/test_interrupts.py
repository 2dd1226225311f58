"""Ctrl-C, SIGTERM and SIGKILL of the search itself: the study stays consistent, no
process is left behind, and the same command resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from conftest import PLAIN_LEVERS, TINY_GPT2, autotune, probes_running, write_model

pytestmark = pytest.mark.slow

ARGV = [  # no rehearsal, no paired rounds: the interrupts are caught in probes and parity
    "search",
    "--model",
    "./tiny",
    "--device",
    "cpu",
    "--no-rehearse",
    "--confirm-rounds",
    "0",
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
    "--parity",
    "off",  # the parity run's own interrupt has its test below
    "--quiet",
]


def start(work: Path, argv: list[str] = ARGV) -> subprocess.Popen[str]:
    """The search as a terminal starts it. SIGINT back to its default first: a test run
    started as a background job of a non-interactive shell inherits SIGINT ignored, and
    Python then installs no KeyboardInterrupt handler (the search would not see Ctrl-C)."""
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *argv],
        cwd=work,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


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
    measured = [t.params for t in trials if t.user_attrs.get("outcome") == "ok"]
    assert len(measured) == len({tuple(sorted(p.items())) for p in measured})  # none twice
    assert (tmp_path / "studies/tiny.best.json").is_file()  # and it exports


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


def test_ctrl_c_twice_during_a_parity_run_exits_130_and_the_rerun_finishes(
    tmp_path: Path,
) -> None:
    """The second Ctrl-C lands while the first is still being handled (the parity run's
    process group killed, the study written): still exit 130, no traceback, nothing left
    running, and the same command resumes."""
    write_model(tmp_path / "tiny", TINY_GPT2)
    argv = [*ARGV, "--parity-steps", "300"]
    argv[argv.index("--parity") + 1] = "on"
    argv[argv.index("--optimizers") + 1] = "adafactor"  # not your recipe's: parity runs
    argv[argv.index("--max-trials") + 1] = "2"
    argv[argv.index("--measure-steps") + 1] = "3"
    search = start(tmp_path, argv)
    deadline = time.monotonic() + 240
    trials = tmp_path / "studies/tiny/trials"
    while time.monotonic() < deadline:
        assert search.poll() is None, search.communicate()
        parity = trials.is_dir() and any(d.name.startswith("parity-") for d in trials.iterdir())
        if parity and probes_running(tmp_path, trials_only=True):
            break
        time.sleep(0.2)
    time.sleep(1.0)  # into its training steps
    search.send_signal(signal.SIGINT)
    time.sleep(0.3)
    search.send_signal(signal.SIGINT)
    _, err = search.communicate(timeout=60)
    assert search.returncode == 130, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert err.strip().splitlines()[-1].startswith("interrupted")
    time.sleep(1.0)
    assert probes_running(tmp_path) == []
    # adafactor learns unlike the recipe's AdamW: with parity on, nothing would export
    argv[argv.index("--parity") + 1] = "off"
    resumed = start(tmp_path, argv)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert (tmp_path / "studies/tiny.best.json").is_file()
    trials = study(tmp_path).get_trials()
    assert not [t for t in trials if t.state.name == "RUNNING"]
    configs = [t.params for t in trials if t.user_attrs.get("outcome") == "ok"]
    assert len(configs) == 2 and configs[0] != configs[1]  # both probes kept, none twice


def test_a_probe_that_stops_responding_times_out_and_the_search_goes_on(
    tmp_path: Path,
) -> None:
    """A probe stopped (SIGSTOP: as a deadlock looks from outside) is killed with its
    process group at --trial-timeout; the trial says so and the next config is probed."""
    write_model(tmp_path / "tiny", TINY_GPT2)
    argv = [*ARGV, "--trial-timeout", "15s"]
    argv[argv.index("--measure-steps") + 1] = "3"
    search = start(tmp_path, argv)
    deadline = time.monotonic() + 180
    while not (child := probes_running(tmp_path, trials_only=True)):
        assert search.poll() is None and time.monotonic() < deadline, search.communicate()
        time.sleep(0.1)
    os.kill(child[0], signal.SIGSTOP)
    _, err = search.communicate(timeout=300)
    assert search.returncode == 0, err
    assert probes_running(tmp_path) == []
    (hung,) = [t for t in study(tmp_path).get_trials() if t.user_attrs.get("outcome") == "timeout"]
    assert hung.user_attrs["reason"].startswith("timeout after 15 s")
    measured = [t for t in study(tmp_path).get_trials() if t.user_attrs.get("outcome") == "ok"]
    assert len(measured) == 2  # the other configs were probed after it


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """studies/ on a 3 MiB filesystem of its own (tmpfs: mounting needs root)."""
    studies = tmp_path / "studies"
    studies.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(studies)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.strip()[:120]}")
    try:
        yield studies
    finally:
        subprocess.run(["umount", "-l", str(studies)], check=False)


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
    return filler


def test_a_disk_that_fills_mid_search_stops_in_one_line_and_the_rerun_finishes(
    tmp_path: Path, small_disk: Path
) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    search = start(tmp_path)
    wait_for_second_probe(tmp_path, search)
    filler = fill(small_disk)
    _, err = search.communicate(timeout=300)
    assert search.returncode == 1 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "free disk space" in last, last
    assert "rerun" in last
    assert probes_running(tmp_path) == []
    assert not list(small_disk.rglob(".*.tmp"))  # no half-written file left behind
    shown = autotune(tmp_path, "show", "--study", "tiny")
    assert shown.returncode == 0, shown.stderr  # the study stays readable

    filler.unlink()
    resumed = start(tmp_path)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    export = small_disk / "tiny.best.json"
    before = {path: path.read_text() for path in small_disk.glob("tiny.best*")}
    assert len(before) == 2  # the export and the note beside it that autotune wrote it
    filler = fill(small_disk)
    again = autotune(tmp_path, "export", "--study", "tiny", "--force")
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert "free disk space" in again.stderr.strip().splitlines()[-1]
    assert {path: path.read_text() for path in small_disk.glob("tiny.best*")} == before
    assert export in before  # the last good export and its note, whole, not one new one old
