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
from collections.abc import Sequence
from pathlib import Path

from autotune.errors import TrialFilesError
from autotune.outcomes import classify_exit
from autotune.probe import RESULT_NAME
from autotune.trial import TrialConfig, TrialResult, write_atomic

CONFIG_NAME = "config.json"
_PR_SET_PDEATHSIG = 1


def probe_command(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "autotune.probe", str(config_path)]


def run_trial(
    config: TrialConfig,
    *,
    timeout_s: float,
    command: Sequence[str] | None = None,
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
        result_path.unlink(missing_ok=True)  # a stale result from an interrupted run
    except OSError as exc:
        raise TrialFilesError(
            f"cannot write trial files in {trial_dir}: {exc.strerror or exc}; free disk space "
            "or fix the permissions of studies/, then rerun to resume"
        ) from None
    argv = list(command) if command is not None else probe_command(config_path)
    timed_out = False
    with open(trial_dir / "stdout.log", "wb") as out, open(trial_dir / "stderr.log", "wb") as err:
        child = subprocess.Popen(
            argv,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=_child_env(),
            preexec_fn=_die_with_parent,
        )
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_group(child)
    result, problem = read_result(result_path)
    return classify_exit(
        returncode=child.returncode,
        result=result,
        result_problem=problem,
        timed_out=timed_out,
        limit_in_force=config.memory_budget_bytes is not None,
        timeout_s=timeout_s,
    )


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


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL if the search process dies (Linux prctl).

    The child runs in its own session, so a SIGKILL of the search would otherwise leave
    it running with nobody to enforce its timeout.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's finally-block cleanup still covers Ctrl-C and SIGTERM


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")  # the child builds from a config: never the hub
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
