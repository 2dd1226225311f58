"""The parent side of a trial: launch the child in its own process group, watch it, classify.

The child cannot touch the parent: it runs in a new session (its own process group),
and the whole group is killed on timeout, on Ctrl-C/SIGTERM of the parent, and after
a normal exit (so no stray grandchild survives the trial).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from autotune.core.enums import DeviceKind, Outcome
from autotune.core.errors import LaunchError, TrialFilesError
from autotune.core.files import write_atomic
from autotune.core.nodes import JOIN_S, READ_S
from autotune.core.outcomes import classify_exit, failure_line
from autotune.core.trial import TrialConfig, TrialResult
from autotune.launch.forkserver import (
    READY_TIMEOUT_S,
    REPLY_TIMEOUT_S,
    EarlyServer,
    ForkServer,
    ServerStartError,
)
from autotune.probe.ranks import RESULT_NAME, merge_ranks, rank_result_name
from autotune.probe.shared_model import SharedModel
from autotune.system.devices import process_data_limit
from autotune.system.process import child_env, dies_with, kill_group, stop

CONFIG_NAME = "config.json"
DDP_GRACE_S = 15.0  # torchrun stops its ranks on SIGTERM; SIGKILL after this


def probe_command(config_path: Path, config: TrialConfig) -> list[str]:
    """The child: the probe, or torchrun starting one probe per rank (gloo on the CPU),
    across nodes through its c10d rendezvous at the run's own endpoint and id (so a
    failed run never holds the next one's). torchrun's log directory is the trial's: by
    default it makes one in the system's temp directory for every launch and never
    removes it."""
    if config.nproc_per_node * config.nnodes == 1:
        return [sys.executable, "-m", "autotune.probe", str(config_path)]
    where = ["--standalone"]
    if config.nnodes > 1:
        # the head hosts the rendezvous store; a node that never joins fails the run
        # after JOIN_S, a head that never answers after READ_S; --max-restarts 0: a
        # failed probe is a result, never run again
        where = [
            f"--nnodes={config.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={config.rendezvous}",
            f"--rdzv-id={config.rendezvous_id}",
            f"--rdzv-conf=join_timeout={JOIN_S},read_timeout={READ_S},"
            f"is_host={int(config.node_rank == 0)}",
            "--max-restarts=0",
            "--shutdown-timeout=10",
        ]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *where,
        f"--nproc-per-node={config.nproc_per_node}",
        f"--log-dir={config_path.parent / 'torchrun'}",
        "-m",
        "autotune.probe",
        str(config_path),
    ]


class Peers(Protocol):
    """The other nodes of a run across nodes (tuning/nodes.HeadPeers)."""

    def announce(self, config: TrialConfig, timeout_s: float) -> TrialConfig:
        """The run with its rendezvous, told to the other nodes, which start their share."""
        ...

    def gather(self, config: TrialConfig) -> dict[int, str]:
        """The results the other nodes' ranks wrote (rank -> TrialResult JSON)."""
        ...


class Launcher:
    """Runs probes: forked from a pre-imported server when `server_log` is given (started
    on first use, restarted if it dies or a probe needs another limit), else each in a
    fresh interpreter; a run across nodes with `peers`, the other nodes."""

    def __init__(
        self,
        device_kind: DeviceKind,
        server_log: Path | None,
        shared: SharedModel | None = None,
        early: EarlyServer | None = None,
        peers: Peers | None = None,
    ) -> None:
        """`early`: a server the search started ahead (importing meanwhile), for the first."""
        self.device_kind = device_kind
        self.server_log = server_log
        self.shared = shared  # the model the server builds once
        if server_log is None and early is not None:  # every probe starts fresh: unused
            early.discard()
            early = None
        self.early = early
        self.server: ForkServer | None = None
        self.no_server: set[int | None] = set()  # limits under which a server cannot start
        self.peers = peers

    def run(
        self, config: TrialConfig, *, timeout_s: float, ready_s: float | None = None
    ) -> TrialResult:
        """Run one trial within `timeout_s`; a fork server that must start first may take
        `ready_s` (default: `timeout_s`) of its own, at most READY_TIMEOUT_S."""
        if config.nnodes > 1:
            peers = self.peers
            if peers is None:
                raise LaunchError("a run across nodes needs the other nodes' searches")
            config = peers.announce(config, timeout_s)
            return run_trial(config, timeout_s=timeout_s, gather=lambda: peers.gather(config))
        if config.nproc_per_node > 1:  # torchrun starts every rank afresh: no server
            return run_trial(config, timeout_s=timeout_s)
        limit = process_data_limit(self.device_kind, config.memory_limit_bytes)
        server = self._server(limit, config.model.trainer, ready_s=ready_s or timeout_s)
        if server is None:
            return run_trial(config, timeout_s=timeout_s)
        try:
            return run_trial(config, timeout_s=timeout_s, server=server)
        except LaunchError as exc:  # it died or stopped answering: this probe starts fresh
            print(f"note: {exc}; the probe starts afresh", file=sys.stderr)
            self.close()
            return run_trial(config, timeout_s=timeout_s)

    def _server(
        self, limit: int | None, factory: str = "", ready_s: float = READY_TIMEOUT_S
    ) -> ForkServer | None:
        """A live server under this limit (with the user's factory module imported); None
        where probes must start fresh (no server wanted, CUDA initialised at import, or
        the imports do not fit under the limit: a fresh probe then records that as its
        own out-of-memory)."""
        if self.server_log is None or limit in self.no_server:
            return None
        if self.server is None or not self.server.alive() or self.server.data_limit != limit:
            self._close_server()
            try:
                self.server = ForkServer(
                    self.server_log,
                    data_limit=limit,
                    shared=self.shared,
                    preload=factory,
                    ready_s=min(ready_s, READY_TIMEOUT_S),  # no longer than a probe may take
                    early=self.early,
                )
            except ServerStartError:
                self.no_server.add(limit)
                return None
        return None if self.server.fresh_only else self.server

    def close(self) -> None:
        self._close_server()
        if self.early is not None:  # taken by the first server, or never used
            self.early.discard()
            self.early = None

    def _close_server(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def run_trial(
    config: TrialConfig,
    *,
    timeout_s: float,
    command: Sequence[str] | None = None,
    server: ForkServer | None = None,
    gather: Callable[[], dict[int, str]] | None = None,
) -> TrialResult:
    """Run one trial to completion and return its classified result.

    `command` replaces the probe (tests use it to run a child that hangs or crashes);
    `gather`: after this node's run, the results the other nodes' ranks wrote."""
    trial_dir = Path(config.trial_dir)
    _write_config(config, trial_dir)
    started = time.monotonic()
    if server is not None and command is None and config.nproc_per_node == 1:
        returncode, timed_out = _run_forked(server, trial_dir / CONFIG_NAME, trial_dir, timeout_s)
    else:
        argv = list(command or probe_command(trial_dir / CONFIG_NAME, config))
        processes = config.nproc_per_node * config.nnodes
        grace = DDP_GRACE_S if processes > 1 else 0.0
        returncode, timed_out = _run_process(argv, trial_dir, timeout_s, grace)
        if gather is not None:  # the other nodes' ranks' results, beside this node's
            for rank, text in gather().items():
                path = trial_dir / rank_result_name(rank)
                if not path.exists():
                    path.write_text(text, encoding="utf-8")
        if processes > 1:
            merge_ranks(trial_dir, processes)
    wall = time.monotonic() - started
    result, problem = read_result(trial_dir / RESULT_NAME)
    classified = classify_exit(
        returncode=returncode,
        result=result,
        result_problem=problem,
        timed_out=timed_out,
        limit_in_force=config.memory_limit_bytes is not None,
        timeout_s=timeout_s,
    )
    if result is None and classified.outcome == Outcome.ERROR:  # say what it printed
        if said := failure_line(_tail(trial_dir / "stderr.log")):
            classified = classified.replace(reason=f"{classified.reason}; {said}", error=said)
    return classified.replace(phases_s={**classified.phases_s, "wall": round(wall, 3)})


def run_share(config: TrialConfig, *, timeout_s: float) -> dict[int, str]:
    """This node's share of a run across nodes (a follower's): its ranks' results, as
    written (rank -> TrialResult JSON); none where they wrote none."""
    trial_dir = Path(config.trial_dir)
    _write_config(config, trial_dir)
    _run_process(probe_command(trial_dir / CONFIG_NAME, config), trial_dir, timeout_s, DDP_GRACE_S)
    results = {}
    for rank in range(config.nproc_per_node * config.nnodes):
        with contextlib.suppress(OSError):
            results[rank] = (trial_dir / rank_result_name(rank)).read_text(encoding="utf-8")
    return results


def _tail(path: Path, size: int = 64 * 1024) -> str:
    """The end of a log ('' when it cannot be read)."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - size))
            return log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _write_config(config: TrialConfig, trial_dir: Path) -> None:
    try:
        trial_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(trial_dir / CONFIG_NAME, config.to_json())
        for stale in trial_dir.glob("result*.json"):  # from an interrupted run
            stale.unlink()
    except OSError as exc:
        raise TrialFilesError(
            f"cannot write trial files in {trial_dir}: {exc.strerror or exc}; free disk space "
            "or fix the permissions of studies/, then rerun to resume"
        ) from None


def _run_process(
    argv: list[str], trial_dir: Path, timeout_s: float, grace_s: float
) -> tuple[int, bool]:
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
            preexec_fn=dies_with(os.getpid()),
        )
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            stop(child, grace_s=grace_s if timed_out or child.poll() is None else 0.0)
    return int(child.returncode), timed_out


def _run_forked(
    server: ForkServer, config_path: Path, trial_dir: Path, timeout_s: float
) -> tuple[int, bool]:
    """A child forked from the pre-imported server; returns (return code, timed out)."""
    pid = server.start(config_path, trial_dir / "stdout.log", trial_dir / "stderr.log")
    returncode = killed = None
    try:
        returncode = server.wait(timeout_s)
    finally:
        if returncode is None:  # timed out, or interrupted: the whole group goes
            kill_group(pid)
            killed = server.reap(REPLY_TIMEOUT_S)
    kill_group(pid)  # a grandchild left behind by a child that exited
    if returncode is not None:
        return returncode, False
    if killed is None:  # the server itself stopped: it, not the probe, is what hung
        raise LaunchError(f"the fork server stopped answering (see {server.log})")
    return killed, True


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
    except ValueError as exc:  # not JSON, or not a result of this version
        return None, f"malformed result.json ({exc})"
