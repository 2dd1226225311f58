"""The nodes a search spans, from torchrun's flags or Slurm's environment."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from autotune.core.errors import UsageError
from autotune.core.nodes import Nodes, nodes_of


def test_the_nodes_come_from_torchruns_flags() -> None:
    assert nodes_of(1, None, None) == Nodes()
    assert nodes_of(2, 1, "10.0.0.5:29400", env={}) == Nodes(2, 1, "10.0.0.5")
    assert nodes_of(4, 0, "head-node", env={}) == Nodes(4, 0, "head-node")
    assert nodes_of(2, 0, "head", env={}).is_head and nodes_of(2, 1, "head", env={}).many


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((0, None, None), "--nnodes 0: give 1 or more nodes"),
        ((1, 1, None), "--node-rank and --rdzv-endpoint are for --nnodes 2 or more"),
        ((2, None, "head"), "give this node's --node-rank (0 on the head), or run under srun"),
        ((2, 2, "head"), "--node-rank 2: ranks of 2 nodes are 0 to 1"),
        ((2, 1, None), "give --rdzv-endpoint HOST"),
    ],
)
def test_nodes_that_cannot_be_told_are_refused_saying_what_to_give(
    args: tuple[int, int | None, str | None], said: str
) -> None:
    with pytest.raises(UsageError, match=said.replace("(", r"\(").replace(")", r"\)")):
        nodes_of(*args, env={})


def test_under_srun_the_rank_and_the_head_come_from_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SLURM_NODEID is the node's index; the head is the job's first node, as
    `scontrol show hostnames` expands SLURM_JOB_NODELIST (a stand-in scontrol here)."""
    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/sh\n[ "$3" = "gpu[07-08]" ] && printf "gpu07\\ngpu08\\n"\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    env = {"SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert nodes_of(2, None, None, env=env) == Nodes(2, 1, "gpu07")
    assert nodes_of(2, 0, "other:1", env=env) == Nodes(2, 0, "other")  # flags first
