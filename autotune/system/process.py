"""Process plumbing shared by every launcher: the child's environment, death with the
parent, and killing a whole process group."""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a probe (or of the fork server its probes come from)."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")  # the child builds from a config: never the hub
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # pyarrow (imported by `datasets`, which Trainer imports) reserves ~1 GiB of address
    # space for its default mimalloc pool at import; RLIMIT_DATA counts it, so the CPU
    # budget would lose it before training starts. The system allocator reserves nothing.
    env["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    # Fork safety: torch.cuda.is_available() answers from NVML, without creating the
    # CUDA context a forked child could not use (the fork server checks it stays so).
    env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    env.update(extra or {})
    return env


def die_with_parent(parent: int | None = None) -> None:
    """Get SIGKILL if the parent process dies (Linux prctl); call in the child.

    A probe runs in its own session, so a SIGKILL of the search would otherwise leave it
    running with nobody to enforce its timeout; a DDP rank would hold its GPU memory.
    `parent`: the pid the caller expects as its parent; if it died before the prctl, the
    signal will never come, so exit now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's finally-block cleanup still covers Ctrl-C and SIGTERM
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def dies_with(parent: int) -> Callable[[], None]:
    """A preexec_fn for subprocess: the child dies with `parent` (this process)."""
    return functools.partial(die_with_parent, parent)


def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group; nothing to do when it is gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop(child: subprocess.Popen[bytes], *, grace_s: float = 0.0) -> None:
    """End a child started in its own session, and everything in its group.

    With a grace period the child first gets SIGTERM (torchrun then stops its ranks,
    which run in sessions of their own, and each rank also dies with its parent)."""
    try:
        if grace_s > 0 and child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGTERM)
                child.wait(timeout=grace_s)
            except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                pass
    finally:  # a second Ctrl-C during the grace still ends the group
        kill_group(child.pid)
        child.wait()
