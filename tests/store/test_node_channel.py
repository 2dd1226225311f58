"""The nodes' channel in the study's storage: presence, runs announced, results reported."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import drop_once

from autotune.store import _coordination
from autotune.store.keys import Attr
from autotune.store.nodes import ALIVE, DONE, GONE, NodeChannel


@pytest.fixture(params=["sqlite", "journal"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'studies.db'}"
    return str(tmp_path / "studies.log")


def test_a_node_is_alive_while_its_search_runs_done_after_and_gone_when_it_died(
    url: str,
) -> None:
    head, follower = NodeChannel.open(url, "s"), NodeChannel.open(url, "s")
    with head.present(0):
        assert follower.nodes() == {0: ALIVE}
        with follower.present(1):
            assert head.nodes() == {0: ALIVE, 1: ALIVE}
        assert head.nodes() == {0: ALIVE, 1: DONE}
    assert follower.nodes()[0] == DONE
    # a node whose search died on this host (its pid is gone) is gone at once
    dead = head.study.ask()
    ns = _coordination.pid_namespace()
    dead.set_user_attr(Attr.WORKER, f"{_coordination.HOST}|{ns}|999999999|gone")
    dead.set_user_attr("node", 2)
    assert head.nodes()[2] == GONE


def test_a_node_that_arrives_as_the_storage_restarts_is_present(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = NodeChannel.open(url, "s")
    calls = drop_once(monkeypatch, head.study, "ask")
    with head.present(0):
        assert NodeChannel.open(url, "s").nodes() == {0: ALIVE}
    assert head.nodes() == {0: DONE} and len(calls) == 2


def test_a_run_is_announced_joined_reported_and_closed(url: str) -> None:
    head, follower = NodeChannel.open(url, "s"), NodeChannel.open(url, "s")
    first = head.announce('{"number": 3}', 60.0)
    assert follower.announced(-1) == [(first, '{"number": 3}', 60.0)]
    follower.report(first, 1, {1: '{"outcome": "ok"}'})
    assert head.reports(first) == {1: {1: '{"outcome": "ok"}'}}
    head.close(first)
    assert follower.announced(-1) == []  # a closed run is joined by no node
    follower.report(first, 2, {2: "late"})  # too late: dropped, no error
    second = head.announce("{}", 5.0)
    assert [n for n, _, _ in follower.announced(first)] == [second]
