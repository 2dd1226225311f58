"""DeepSpeed ZeRO for multi-process probes: the stage a recipe runs, how a stage splits
the training's state, and the one-time build of the C++ op DeepSpeed's collectives use
on the CPU. The config a stage exports is its lever's (core/levers.deepspeed_config).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from autotune.core.errors import UsageError
from autotune.core.levers import ZERO_STAGE

BUILD_TIMEOUT_S = 600
OP = "deepspeed_shm_comm"  # the op's folder under torch's extensions root
LEAVE_OUT = f"--lever {ZERO_STAGE.name}=0"


def deepspeed_stage(arguments: dict[str, Any]) -> int:
    """The ZeRO stage a recipe's inline `deepspeed` config runs (0: none, or a path)."""
    config = arguments.get("deepspeed")
    if not isinstance(config, dict):
        return 0
    stage = config.get("zero_optimization", {}).get("stage", 0)
    return stage if isinstance(stage, int) else 0


def cpu_op_error() -> str:
    """Why DeepSpeed's shared-memory op cannot be built here ("" when it can)."""
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None:
        return f"DeepSpeed on the CPU builds a C++ op ({compiler} not found)"
    return ""


def build_cpu_op() -> None:
    """Build DeepSpeed's CPU communication op once (cached per machine), in a child, so
    no probe pays the build in its timing or under its memory limit."""
    code = (
        "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B\n"
        "b = B()\n"
        "b.load(verbose=False) if b.is_compatible() else None\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise UsageError(
            f"building DeepSpeed's CPU op took over {BUILD_TIMEOUT_S} s{_held_lock()}; "
            f"leave ZeRO out with {LEAVE_OUT}"
        ) from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise UsageError(
            f"DeepSpeed's CPU op did not build ({last}); leave ZeRO out with {LEAVE_OUT}"
        )


def _held_lock() -> str:
    """Where torch's build lock for the op is, if one is: a build killed mid-way leaves
    it, and every later build waits on it for ever (a CI run killed while building made
    the next one time out here)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        # torch is heavy: only a build that timed out needs it
        from torch.utils.cpp_extension import get_default_build_root

        root = get_default_build_root()
    locks = [*Path(root).glob(f"{OP}/lock"), *Path(root).glob(f"*/{OP}/lock")]
    if not locks:
        return ""
    return (
        f", waiting on the build lock {locks[0]}: if no other build is running, an "
        "interrupted one left it; delete it and search again"
    )
