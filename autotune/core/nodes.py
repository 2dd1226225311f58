"""The nodes a probe spans: how many, this one's rank, and where the head is.

`autotune search` runs on every node, as torchrun does: the head (rank 0) searches and
records, the others follow it through the study's storage and run their share of each
probe (`tuning/follow.py`). The flags are named as torchrun's; under Slurm's `srun`
the rank and the head come from its environment where the flags do not say.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Mapping

from autotune.core.errors import UsageError

# Bounds of a multi-node probe's failures (measured on loopback: docs/scale-out.md)
JOIN_S = 60  # a node that never joins a probe's rendezvous fails it after this
READ_S = 30  # a follower whose head's rendezvous store never answers
PROCESS_GROUP_S = 60  # a silent peer (a node frozen, a rank gone before the first step)
REPORT_S = 30  # a follower's ranks' results reach the head within this of its own end
FOLLOWERS_S = 120  # the followers' searches join the study within this at the start


@dataclasses.dataclass(frozen=True)
class Nodes:
    count: int = 1
    rank: int = 0
    head: str = ""  # the head's address as the other nodes reach it (a host name or IP)

    @property
    def many(self) -> bool:
        return self.count > 1

    @property
    def is_head(self) -> bool:
        return self.rank == 0


def nodes_of(
    count: int, rank: int | None, endpoint: str | None, env: Mapping[str, str] = os.environ
) -> Nodes:
    """The nodes from --nnodes, --node-rank and --rdzv-endpoint, the last two read from
    Slurm's environment under `srun` where they are not given; UsageError on anything off."""
    if count < 1:
        raise UsageError(f"--nnodes {count}: give 1 or more nodes")
    if count == 1:
        if rank or endpoint:
            raise UsageError("--node-rank and --rdzv-endpoint are for --nnodes 2 or more")
        return Nodes()
    if rank is None:
        rank = _slurm_int(env, "SLURM_NODEID")
    if rank is None:
        raise UsageError(
            f"--nnodes {count}: give this node's --node-rank (0 on the head), or run under srun"
        )
    if not 0 <= rank < count:
        raise UsageError(f"--node-rank {rank}: ranks of {count} nodes are 0 to {count - 1}")
    head = (endpoint or "").rpartition(":")[0] if ":" in (endpoint or "") else endpoint or ""
    head = head or _slurm_head(env)
    if not head:
        raise UsageError(
            f"--nnodes {count}: give --rdzv-endpoint HOST (the head's address every node "
            "reaches), or run under srun"
        )
    return Nodes(count, rank, head)


def _slurm_int(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name, "")
    return int(text) if text.isdigit() else None


def _slurm_head(env: Mapping[str, str]) -> str:
    """The first node of Slurm's job (`scontrol show hostnames`), '' outside Slurm."""
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    if not nodelist or shutil.which("scontrol") is None:
        return ""
    done = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    names = done.stdout.split()
    return names[0] if done.returncode == 0 and names else ""
