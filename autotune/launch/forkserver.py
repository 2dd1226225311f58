"""A pre-imported fork server for probe children: each trial still gets its own process,
without paying for the torch + transformers import every time.

The server is started once per search (`python -m autotune.launch.forkserver`), as early
as the search can (`EarlyServer`: its imports overlap the search's own), imports the
heavy libraries, then reads its setup (log, memory limit, the user's factory, the model
to share), checks that no import initialised CUDA (a forked child could not use it),
and then, for each request on stdin (one JSON line: the probe's config path and log
paths), forks a child that starts its own session, dies with the server, redirects
its output, and runs the probe. The server answers with the child's pid, and later with
its exit status. Before its setup it forks the survey of a user's job the same way
(`EarlyServer.survey`: a fresh interpreter would import everything a second time).

Given the search's model (`SharedModel`), the server also builds it once, after the
imports, and every forked probe that would build the same model inherits it
(probe/shared_model.py).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from autotune.core.enums import DeviceKind
from autotune.core.errors import LaunchError
from autotune.core.files import parse_json, write_atomic
from autotune.core.levers import model_arguments
from autotune.core.spec import SearchSpec
from autotune.hf.factory import load_factory
from autotune.probe import device, fork_pages, shared_model
from autotune.probe.job import main as job_main
from autotune.probe.main import main
from autotune.probe.shared_model import SharedModel
from autotune.system.devices import capability_from_nvml, cpu_memory_bytes, cuda_initialized
from autotune.system.process import child_env, die_with_parent, dies_with

PRELOAD = (
    "torch",
    "transformers.trainer",  # `transformers` alone is lazy: the Trainer is the heavy part
    "transformers.training_args",
    "transformers.models.auto.modeling_auto",
    "accelerate",
    # the probe's modules that import the libraries above (probe.main, imported with
    # this module, imports them inside its functions)
    "autotune.probe.timing",
    "autotune.probe.data",
)
READY_TIMEOUT_S = 300.0
REPLY_TIMEOUT_S = 15.0  # a fork, or reaping a killed child, takes far less when it is well
LONGEST_WAIT_S = 10**7  # select() overflows on larger timeouts; this is 115 days


def serve(requests: IO[str], replies: IO[str]) -> None:
    """Import the heavy libraries, fork the survey of the user's job if asked, then take
    the setup line (its log, limit, shared model and the user's factory), then fork a
    child for each request line."""

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the search's to handle
    # torch.cuda.is_available() through NVML: cudaGetDeviceCount would initialise the
    # driver, which a forked child cannot use (torch's documented fork-safe check)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    try:  # before the setup comes: a server started early imports while the search plans
        with capability_from_nvml():
            for name in PRELOAD:
                importlib.import_module(name)
    except Exception as exc:
        _reply(replies, {"ready": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
        return
    line = requests.readline()
    while line and "job" in (request := json.loads(line)):  # the survey, before the setup
        if cuda_initialized():  # its child could not use the GPU: a fresh one surveys
            _reply(replies, {"error": "an import initialised CUDA in the fork server"})
        else:
            _fork(request, replies, lambda r: job_main([r["job"]]))
        line = requests.readline()
    if not line:  # the search ended (or chose another server) before using this one
        return
    setup = json.loads(line)
    _log_to(setup["log"])
    try:
        if setup.get("preload"):  # the user's module, after transformers
            with capability_from_nvml():
                load_factory(setup["preload"])
        if setup.get("data_limit") is not None:  # as a fresh probe sets it; children inherit
            device.limit_data_segment(int(setup["data_limit"]))
    except MemoryError:  # the imports hold more than the limit: say so, and stop
        _reply(replies, {"ready": False, "error": "out of memory while importing"})
        return
    except Exception as exc:  # the user's module failed to import: probes say why
        _reply(replies, {"ready": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
        return

    fork_pages.remember()  # so that the children report peaks as a fresh process would
    shared = setup.get("shared")
    built = _build_shared(shared) if shared else None
    _reply(replies, {"ready": True, "cuda_initialized": cuda_initialized(), "shared_model": built})
    for line in requests:
        _fork(json.loads(line), replies, lambda r: main([r["config"]]))


def _fork(request: dict[str, Any], replies: IO[str], run: Callable[[dict[str, Any]], int]) -> None:
    """A child runs `run(request)`; the server answers with its pid, then its status."""
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        _run_child(request, server, run)
    _reply(replies, {"pid": pid})
    _, status = os.waitpid(pid, 0)
    _reply(replies, {"pid": pid, "returncode": _returncode(status)})


def _log_to(path: str) -> None:
    """stderr to the search's log from now on, after what the imports wrote before (to
    the temporary file the server was started with, read back through /proc)."""
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    if stat.S_ISREG(os.fstat(2).st_mode):
        with contextlib.suppress(OSError), open("/proc/self/fd/2", "rb") as early:
            os.write(log, early.read())
    os.dup2(log, 2)
    os.close(log)


def _build_shared(path: str) -> str:
    """Build the search's model once; what happened, in a few words (a failure only
    means each probe builds its own, as without a server)."""

    try:
        text = Path(path).read_text(encoding="utf-8")
        seconds = shared_model.build(shared_model.SharedModel.from_json(text))
    except Exception as exc:  # MemoryError under the limit, a model that will not build
        print(f"the shared model was not built: {type(exc).__name__}: {exc}", file=sys.stderr)
        return f"not built: {type(exc).__name__}"
    return f"built in {seconds:.1f} s"


def _run_child(request: dict[str, Any], server: int, run: Callable[[dict[str, Any]], int]) -> None:
    code = 1
    try:
        os.setsid()
        die_with_parent(server)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        code = run(request)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # the probe classifies its own failures; this is a crash
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _returncode(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _reply(replies: IO[str], message: dict[str, Any]) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()


class ServerStartError(LaunchError):
    """The server could not get ready (its imports failed, or took too long)."""


class ForkServer:
    """The parent's handle on a running server; one trial at a time."""

    def __init__(
        self,
        log: Path,
        *,
        data_limit: int | None = None,
        shared: SharedModel | None = None,
        preload: str = "",
        ready_s: float = READY_TIMEOUT_S,
        early: EarlyServer | None = None,
    ) -> None:
        """`preload`: the user's factory, whose module (and its imports: peft, trl) the
        server imports once, as it does torch. `early`: a server started ahead, whose
        imports may be done by now; else one is started here."""
        self.data_limit = data_limit
        self.shared = shared
        self.log = log
        self.fresh_only = False  # True: CUDA was initialised at import; fork is unsafe
        log.parent.mkdir(parents=True, exist_ok=True)
        process = early.take() if early is not None else None
        self.process = process or EarlyServer().take()
        self._buffer = b""
        self.broken = False  # a child it could not reap: its replies are out of step
        setup: dict[str, Any] = {"log": str(log), "data_limit": data_limit, "preload": preload}
        if shared is not None:  # in a file: a model's config can outgrow a line
            model_file = log.with_name(f"{log.stem}-model.json")
            write_atomic(model_file, shared.to_json())
            setup["shared"] = str(model_file)
        with contextlib.suppress(OSError):  # it ended already: its reply says why
            self._send(setup)
        try:
            ready = self._read(timeout=ready_s)
        except LaunchError:
            ready = None
        if ready is None or not ready.get("ready"):
            self.close()
            why = ready.get("error") if ready else f"no answer within {ready_s:.0f} s"
            raise ServerStartError(f"the fork server did not start: {why} (see {log})")
        self.shared_model = str(ready.get("shared_model") or "")
        if ready.get("cuda_initialized"):
            self.fresh_only = True
            print(
                f"note: an import initialised CUDA in the fork server, so forked probes "
                f"could not use the GPU; each probe starts a fresh process (see {log})",
                file=sys.stderr,
            )

    def alive(self) -> bool:
        return self.process.poll() is None and not self.broken

    def start(self, config: Path, stdout: Path, stderr: Path) -> int:
        """Fork a probe child for this config; returns its pid (also its process group)."""
        if self.process.stdin is None:
            raise LaunchError("the fork server has no input pipe")
        self._send({"config": str(config), "stdout": str(stdout), "stderr": str(stderr)})
        reply = self._read(timeout=REPLY_TIMEOUT_S)
        if reply is None or "pid" not in reply or "returncode" in reply:
            self.broken = True
            raise LaunchError(f"the fork server did not answer as expected (see {self.log})")
        return int(reply["pid"])

    def wait(self, timeout: float | None) -> int | None:
        """The current child's return code (negative: a signal), or None on timeout."""
        reply = self._read(timeout)
        if reply is not None and "returncode" not in reply:
            self.broken = True
            raise LaunchError(f"the fork server answered out of step (see {self.log})")
        return None if reply is None else int(reply["returncode"])

    def reap(self, timeout: float) -> int | None:
        """After killing the current child: its return code, or None if the server went
        too (Ctrl-C reached it) and there is nothing to reap."""
        try:
            code = self.wait(timeout)
        except LaunchError:
            code = None
        if code is None:  # still waiting on that child: never reuse this server
            self.broken = True
        return code

    def close(self) -> None:
        """Stop the server: no child of it runs between trials, and its interpreter's own
        shutdown (seconds, with torch loaded) is nothing anyone waits for."""
        _stop(self.process)

    def _send(self, message: dict[str, Any]) -> None:
        if self.process.stdin is None:
            raise LaunchError("the fork server has no input pipe")
        self.process.stdin.write((json.dumps(message) + "\n").encode())

    def _read(self, timeout: float | None) -> dict[str, Any] | None:
        """One JSON line from the server, or None if none came within the timeout."""
        reply, self._buffer = _read_reply(self.process, self._buffer, timeout, str(self.log))
        return reply


def _read_reply(
    process: subprocess.Popen[bytes], buffer: bytes, timeout: float | None, log: str
) -> tuple[dict[str, Any] | None, bytes]:
    """One JSON line from a server (None if none came within the timeout), and what it
    sent after that line."""
    if process.stdout is None:
        raise LaunchError("the fork server has no output pipe")
    fd = process.stdout.fileno()
    wait = None if timeout is None else min(timeout, LONGEST_WAIT_S)
    deadline = None if wait is None else time.monotonic() + wait
    while b"\n" not in buffer:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None, buffer
        chunk = os.read(fd, 65536)
        if not chunk:
            raise LaunchError(
                f"the fork server exited (code {process.poll()}; see {log}); "
                "rerun to resume, or pass --no-fork-server"
            )
        buffer += chunk
    line, buffer = buffer.split(b"\n", 1)
    try:
        return dict(parse_json(line)), buffer
    except (ValueError, TypeError):  # not JSON (too deep, too long too), or no object
        raise LaunchError(f"the fork server sent {line[:80]!r} (see {log})") from None


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)


class EarlyServer:
    """A fork server started ahead of its first use, so that its imports (torch,
    transformers: seconds) run while the search reads its options, opens the study and
    plans. `ForkServer(..., early=)` takes it; `discard` stops one never taken. Until
    then it writes to an unlinked temporary file (nothing is left behind), copied into
    the real log when it is set up."""

    def __init__(self) -> None:
        with tempfile.TemporaryFile(prefix="autotune-forkserver-") as err:
            self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-m", "autotune.launch.forkserver"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                bufsize=0,
                env=child_env(),
                preexec_fn=dies_with(os.getpid()),
            )
        self._buffer = b""  # what it sent past the last reply read

    def survey(self, request: Path, stderr: Path, timeout_s: float) -> int | None:
        """Build the user's job (`autotune.probe.job` on `request`) in a child forked
        once the server's imports are done, as a probe's would be: its exit status, or
        None when it ran past `timeout_s` (it is killed). LaunchError where the server
        cannot run it (its imports failed, it died, or an import initialised CUDA): the
        caller runs the survey in a fresh interpreter instead."""
        process = self.process
        if process is None or process.stdin is None or process.poll() is not None:
            raise LaunchError("no fork server to survey in")
        try:
            asked = {"job": str(request), "stdout": os.devnull, "stderr": str(stderr)}
            process.stdin.write((json.dumps(asked) + "\n").encode())
            started = self._reply(READY_TIMEOUT_S)
            if started is not None and "pid" in started and "returncode" not in started:
                return self._ended(int(started["pid"]), timeout_s)
        except (LaunchError, OSError, KeyError, ValueError) as exc:
            self.discard()  # out of step, or gone: no probe may use it
            raise LaunchError(f"the fork server could not run the survey: {exc}") from None
        if started is not None and "error" in started and "ready" not in started:
            # it declined, and is still in step: probes may use it
            raise LaunchError(f"the fork server declined the survey: {started['error']}")
        self.discard()
        raise LaunchError(f"the fork server could not run the survey: it answered {started}")

    def _ended(self, pid: int, timeout_s: float) -> int | None:
        """The survey child's exit status; None past the timeout, the child killed and
        reaped through the server (which is discarded where it does not answer)."""
        ended = self._reply(timeout_s)
        if ended is not None:
            return int(ended["returncode"])
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        if self._reply(REPLY_TIMEOUT_S) is None:
            self.discard()
        return None

    def _reply(self, timeout: float) -> dict[str, Any] | None:
        if self.process is None:
            raise LaunchError("the fork server is gone")
        reply, self._buffer = _read_reply(self.process, self._buffer, timeout, "its log")
        return reply

    def take(self) -> subprocess.Popen[bytes]:
        """The process, once (a second take, or one of a server that died: a new one)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return EarlyServer().take()
        return process

    def discard(self) -> None:
        if self.process is not None:
            _stop(self.process)
            self.process = None


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.stdin is not None:
        process.stdin.close()
    process.kill()
    process.wait()


def model_to_share(spec: SearchSpec, concurrent: int = 1) -> SharedModel | None:
    """The model the fork server builds once for every probe (with the space's first
    attention), or None: DDP probes start fresh; on the CPU each worker's server copy
    must fit in the machine beside a probe at its limit (its pages are shared until the
    probe writes them, so together they hold at most the limit plus the copy); beside
    a GPU the copies may take at most half the host's memory."""
    if spec.nproc_per_node > 1 or not spec.parameters or spec.model.trainer:
        return None  # a user's factory builds its own model in each probe
    copy = 4 * spec.parameters  # built in fp32
    if spec.device.kind == DeviceKind.CPU:  # each of `concurrent` workers has a server
        if concurrent * (spec.fit_limit_bytes + copy) > spec.device.total_memory_bytes:
            return None
    else:  # host memory, beside a GPU
        if concurrent * copy > cpu_memory_bytes() // 2:
            return None
    plain = {name: values[0] for name, values in spec.space.levers}  # the first probes'
    return SharedModel(spec.model, spec.seed, model_arguments(plain))
