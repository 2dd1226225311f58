"""A search across nodes: the head's side (`HeadPeers`, which tells the other nodes each
run and gathers their ranks' results) and a follower's (`follow`, the whole search of a
node other than the head).

Every node runs `autotune search` with the same arguments and its own --node-rank. The
head plans, proposes, records and exports; a follower joins each run the head
announces in the study's storage, with its share of the processes, and reports what its
ranks wrote. Nothing waits unbounded (core/nodes.py): a node that never joins a run
fails it after JOIN_S, a silent peer after PROCESS_GROUP_S, a follower's report after
REPORT_S; a node whose search is gone stops the head's search with a line naming it.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
import time
import uuid
from pathlib import Path

from autotune.core.errors import StudyError
from autotune.core.nodes import FOLLOWERS_S, REPORT_S, Nodes
from autotune.core.trial import TrialConfig
from autotune.launch.runner import run_share
from autotune.store.nodes import ABSENT, ALIVE, DONE, GONE, NodeChannel

POLL_S = 0.5


class HeadPeers:
    """The head's view of the other nodes (launch/runner.Peers)."""

    def __init__(self, channel: NodeChannel, nodes: Nodes) -> None:
        self.channel = channel
        self.nodes = nodes
        self._runs: dict[str, int] = {}  # rendezvous id -> the run's number in the channel

    def wait_for_followers(self) -> None:
        """Every other node's search present, within FOLLOWERS_S; else StudyError."""
        waited = time.monotonic() + FOLLOWERS_S
        while True:
            missing = self._missing()
            if not missing:
                return
            if time.monotonic() > waited:
                rank, what = missing[0]
                raise StudyError(
                    f"node {rank} {what} within {FOLLOWERS_S} s: start the same `autotune "
                    f"search` there with --node-rank {rank}, then rerun this one"
                )
            time.sleep(POLL_S)

    def _missing(self) -> list[tuple[int, str]]:
        states = self.channel.nodes()
        words = {ABSENT: "did not join the search", GONE: "stopped", DONE: "finished"}
        return [
            (rank, words[states.get(rank, ABSENT)])
            for rank in range(1, self.nodes.count)
            if states.get(rank, ABSENT) != ALIVE
        ]

    def announce(self, config: TrialConfig, timeout_s: float) -> TrialConfig:
        """The run with its own rendezvous (a free port on the head, a fresh id), told to
        the other nodes; StudyError when one of them is gone."""
        missing = self._missing()
        if missing:
            rank, what = missing[0]
            raise StudyError(
                f"node {rank} {what}: the search stops, its results kept; start the same "
                f"`autotune search` there with --node-rank {rank} and rerun this one to resume"
            )
        config = dataclasses.replace(
            config,
            node_rank=0,
            rendezvous=f"{self.nodes.head}:{_free_port()}",
            rendezvous_id=uuid.uuid4().hex[:16],
        )
        self._runs[config.rendezvous_id] = self.channel.announce(config.to_json(), timeout_s)
        return config

    def gather(self, config: TrialConfig) -> dict[int, str]:
        """The other nodes' ranks' results, waited for REPORT_S at most (not at all once
        a node is gone: it will report nothing); the run closed."""
        number = self._runs.pop(config.rendezvous_id)
        waited = time.monotonic() + REPORT_S
        reports = self.channel.reports(number)
        while len(reports) < self.nodes.count - 1 and time.monotonic() < waited:
            if self._missing():
                break
            time.sleep(POLL_S)
            reports = self.channel.reports(number)
        self.channel.close(number)
        return {rank: text for ranks in reports.values() for rank, text in ranks.items()}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def follow(channel: NodeChannel, nodes: Nodes, folder: Path) -> str:
    """A follower's search: each run the head announces, joined with this node's share,
    its ranks' results reported, until the head's search ends; what ended it. Each
    run's files are under `folder`/node<rank>. StudyError when the head is gone."""
    done = -1
    seen_head = time.monotonic() + FOLLOWERS_S
    with channel.present(nodes.rank):
        while True:
            head = channel.nodes().get(0, ABSENT)
            if head == DONE:
                return "the head's search ended"
            if head == GONE or (head == ABSENT and time.monotonic() > seen_head):
                raise StudyError(
                    "node 0 (the head) "
                    + ("stopped" if head == GONE else f"did not start within {FOLLOWERS_S} s")
                    + ": this node's search stops; rerun it with the head's"
                )
            for number, text, timeout_s in channel.announced(done):
                config = TrialConfig.from_json(text)
                trial_dir = folder / f"node{nodes.rank}" / Path(config.trial_dir).name
                config = dataclasses.replace(config, trial_dir=str(trial_dir), node_rank=nodes.rank)
                print(f"node {nodes.rank}: joining run {config.rendezvous_id}", file=sys.stderr)
                channel.report(number, nodes.rank, run_share(config, timeout_s=timeout_s))
                done = number
            time.sleep(POLL_S)
