"""The `autotune` command for the end-to-end tests, each call in a process of its own,
forked from one interpreter per test worker that has already imported what the command
imports on its way (torch, transformers, peft, optuna).

A search's parent spends about 6 s of CPU importing them before its first line of work,
and the suite runs the command about a hundred times: as fresh interpreters that was a
fifth of the suite's CPU. Forked, each call still runs the real command
(`autotune.cli.run`: its argument parsing, its one-line errors, its exit status) in its
own process, with its own working directory, environment and output, and starts its
probes and fork server as fresh interpreters, as installed. What it does not repeat is
the interpreter's start and those imports (what a library logs while importing is not in
a call's output: tests/test_cli.py checks that the command keeps it off the terminal);
tests that start the command as a terminal would (signals, two at once) still start
`python -m autotune` themselves.

Run as a script, this file is that interpreter: it imports, then for each request line
on stdin (JSON: the arguments, the working directory, the environment, where the output
goes) forks the command, answers with its pid, then with its exit status.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

# What the command imports on its way through search, export, show and report. Not
# `datasets`: pyarrow starts a background thread at import, and a fork copies no thread.
PRELOAD = (
    "autotune.cli",
    "autotune.search_command",
    "autotune.commands",
    "autotune.views.report",
    "torch",
    "transformers.training_args",
    "transformers.hf_argparser",
    "transformers.models.auto.modeling_auto",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.t5.modeling_t5",
    "peft",
    "trl",
)


def serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    replies = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _command(request)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        replies.write(json.dumps({"returncode": code}) + "\n")
        replies.flush()


def _command(request: dict[str, Any]) -> None:
    """In the forked child: become `autotune ARGS` started in `cwd` with `env`; never
    returns. It ends as the command does: its atexit handlers, the last of which ends the
    process with the command's status (autotune.cli.run)."""
    import atexit
    import traceback

    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdin = open(0, encoding="utf-8", closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = sys.__stderr__ = open(
            2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False
        )
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = ["autotune", *request["args"]]
        from autotune.cli import run

        run()
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # the command's own end: os._exit with its status
        os._exit(1)  # it never registered one: it failed before it began


class _Forker:
    """This test worker's forking interpreter, started on first use."""

    def __init__(self) -> None:
        from autotune.system.process import dies_with

        self.log = tempfile.TemporaryFile()  # what its imports print; said if it dies
        self.process = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            bufsize=0,
            preexec_fn=dies_with(os.getpid()),
        )
        self.buffer = b""
        self.lock = threading.Lock()

    def send(self, request: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")

    def reply(self, timeout: float | None) -> dict[str, Any] | None:
        """Its next answer, or None if none came within `timeout` seconds."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                self.log.seek(0)
                said = self.log.read().decode(errors="replace")[-2000:]
                code = self.process.wait()
                raise RuntimeError(f"the CLI's forking interpreter exited ({code}): {said}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return dict(json.loads(line))


_FORKER: list[_Forker] = []


def run_cli(
    args: list[str], *, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """`autotune ARGS` run to its end, as `subprocess.run(..., capture_output=True,
    text=True)` would give it back (TimeoutExpired after `timeout` seconds, the command
    killed)."""
    if not _FORKER or _FORKER[0].process.poll() is not None:
        _FORKER[:] = [_Forker()]
    forker = _FORKER[0]
    argv = [sys.executable, "-m", "autotune", *args]
    with forker.lock, tempfile.TemporaryDirectory(prefix="autotune-cli-") as scratch:
        out, err = Path(scratch) / "stdout", Path(scratch) / "stderr"
        request = {
            "args": args,
            "cwd": str(cwd),
            "env": env,
            "stdout": str(out),
            "stderr": str(err),
        }
        forker.send(request)
        started = forker.reply(timeout=None)
        assert started is not None
        ended = forker.reply(timeout=timeout)
        if ended is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(started["pid"]), signal.SIGKILL)
            forker.reply(timeout=None)
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(
            argv,
            int(ended["returncode"]),
            out.read_text(encoding="utf-8"),
            err.read_text(encoding="utf-8", errors="replace"),
        )


if __name__ == "__main__":
    serve()
