"""The parent side of a trial: launch the child in its own process group, watch it, classify.

The child cannot touch the parent: it runs in a new session (its own process group),
and the whole group is killed on timeout, on Ctrl-C/SIGTERM of the parent, and after
a normal exit (so no stray grandchild survives the trial).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.core.errors import TrialFilesError
from autotune.launch.outcomes import classify_exit
from autotune.probe.main import RESULT_NAME, merge_ranks
from autotune.core.trial import TrialConfig, TrialResult, write_atomic

if TYPE_CHECKING:
    from autotune.launch.forkserver import ForkServer

CONFIG_NAME = "config.json"
_PR_SET_PDEATHSIG = 1


def probe_command(config_path: Path, nproc_per_node: int = 1) -> list[str]:
    """The child: the probe, or torchrun starting one probe per rank (gloo on the CPU)."""
    if nproc_per_node > 1:
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc_per_node}", "-m", "autotune.probe", str(config_path),
        ]  # fmt: skip
    return [sys.executable, "-m", "autotune.probe", str(config_path)]


def run_trial(
    config: TrialConfig,
    *,
    timeout_s: float,
    command: Sequence[str] | None = None,
    server: ForkServer | None = None,
) -> TrialResult:
    """Run one trial to completion and return its classified result.

    `command` replaces the probe (tests use it to run a child that hangs or crashes).
    """
    trial_dir = Path(config.trial_dir)
    config_path = trial_dir / CONFIG_NAME
    result_path = trial_dir / RESULT_NAME
    try:
        trial_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(config_path, config.to_json())
        for stale in trial_dir.glob("result*.json"):  # from an interrupted run
            stale.unlink()
    except OSError as exc:
        raise TrialFilesError(
            f"cannot write trial files in {trial_dir}: {exc.strerror or exc}; free disk space "
            "or fix the permissions of studies/, then rerun to resume"
        ) from None
    started = time.monotonic()
    if server is not None and command is None and config.nproc_per_node == 1:
        if config.device_kind == "cpu" and server.data_limit != config.memory_budget_bytes:
            raise ValueError("the fork server must run under the trial's memory budget")
        returncode, timed_out = _run_forked(server, config_path, trial_dir, timeout_s)
    else:
        argv = (
            list(command)
            if command is not None
            else probe_command(config_path, config.nproc_per_node)
        )
        returncode, timed_out = _run_process(argv, trial_dir, timeout_s)
        if config.nproc_per_node > 1:
            merge_ranks(trial_dir, config.nproc_per_node)
    wall = time.monotonic() - started
    result, problem = read_result(result_path)
    classified = classify_exit(
        returncode=returncode,
        result=result,
        result_problem=problem,
        timed_out=timed_out,
        limit_in_force=config.memory_budget_bytes is not None,
        timeout_s=timeout_s,
    )
    return classified.replace(phases_s={**classified.phases_s, "wall": round(wall, 3)})


def _run_process(argv: list[str], trial_dir: Path, timeout_s: float) -> tuple[int, bool]:
    """A fresh interpreter in a new session; returns (return code, timed out)."""
    timed_out = False
    with open(trial_dir / "stdout.log", "wb") as out, open(trial_dir / "stderr.log", "wb") as err:
        child = subprocess.Popen(
            argv,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=child_env(),
            preexec_fn=die_with_parent,
        )
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_group(child)
    return int(child.returncode), timed_out


def _run_forked(
    server: ForkServer, config_path: Path, trial_dir: Path, timeout_s: float
) -> tuple[int, bool]:
    """A child forked from the pre-imported server; returns (return code, timed out)."""
    pid = server.start(config_path, trial_dir / "stdout.log", trial_dir / "stderr.log")
    returncode: int | None = None
    killed: int | None = None
    try:
        returncode = server.wait(timeout_s)
    finally:
        if returncode is None:  # timed out, or interrupted: the whole group goes
            _killpg(pid)
            try:
                killed = server.wait(60)
            except RuntimeError:
                killed = None  # the server went too (Ctrl-C reached it): nothing to reap
    _killpg(pid)  # a grandchild left behind by a child that exited
    if returncode is not None:
        return returncode, False
    return (killed if killed is not None else -signal.SIGKILL), True


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's whole process group, then reap the child."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone
    child.wait()


def read_result(path: Path) -> tuple[TrialResult | None, str]:
    """The child's result, or None and what was wrong with it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, "no result.json"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"unreadable result.json ({exc})"
    try:
        return TrialResult.from_json(text), ""
    except (json.JSONDecodeError, ValueError, TypeError, KeyError) as exc:
        return None, f"malformed result.json ({type(exc).__name__})"


def die_with_parent() -> None:
    """In the child before exec: get SIGKILL if the search process dies (Linux prctl).

    The child runs in its own session, so a SIGKILL of the search would otherwise leave
    it running with nobody to enforce its timeout.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's finally-block cleanup still covers Ctrl-C and SIGTERM


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")  # the child builds from a config: never the hub
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
