"""The nodes of a multi-node search meet in the study's storage: a companion study
(`<study>:nodes`) holds each node's presence, each run the head asks the others to join,
and the results their ranks wrote.

A node's presence is a running trial that records heartbeats while its search lives,
finished when the search ends: a node whose presence went stale, or whose process on
this host is gone, is gone. A run the head announces is a running trial holding its
`TrialConfig`; each other node runs its share and writes its ranks' results on it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from autotune.store import _coordination, compat
from autotune.store._retry import transient_retry
from autotune.store.storage import open_storage, quiet_optuna

SUFFIX = ":nodes"
ALIVE, DONE, GONE, ABSENT = "alive", "done", "gone", "absent"


class NodeChannel:
    def __init__(self, study: optuna.Study, storage: BaseStorage) -> None:
        self.study = study
        self.storage = storage

    @classmethod
    def open(cls, url: str, name: str) -> NodeChannel:
        """The study's channel, made where it is not there yet."""
        quiet_optuna()
        storage = open_storage(url)
        try:
            study = optuna.create_study(
                storage=storage, study_name=name + SUFFIX, load_if_exists=True
            )
        except (optuna.exceptions.DuplicatedStudyError, sqlalchemy.exc.IntegrityError):
            # another node made it at the same moment: join it
            study = optuna.load_study(study_name=name + SUFFIX, storage=storage)
        return cls(study, storage)

    # ---- presence ----------------------------------------------------------------

    @contextlib.contextmanager
    def present(self, node_rank: int) -> Iterator[None]:
        """This node is present while the block runs (heartbeats), done after it."""
        trial, tid = self._arrive(node_rank)
        try:
            with _coordination.heartbeat(self.storage, tid):
                yield
        finally:
            with contextlib.suppress(Exception):  # a storage away: its heartbeats lapse
                self.study.tell(trial, 0.0)  # complete (a channel's trials hold no value)

    @transient_retry
    def _arrive(self, node_rank: int) -> tuple[optuna.Trial, int]:
        """A presence of this node, its first heartbeat recorded: the trial and its id.
        A retry after a half-written one leaves that one behind, superseded: the latest
        presence of a rank is its state."""
        trial = self.study.ask()
        for key, value in _coordination.worker_identity().items():
            trial.set_user_attr(key, value)
        trial.set_user_attr("node", node_rank)
        tid = compat.trial_id(self.storage, self.study, trial.number)
        compat.record_heartbeat(self.storage, tid)
        return trial, tid

    @transient_retry
    def nodes(self) -> dict[int, str]:
        """Each node's state by its rank, from its latest presence: alive, done or gone."""
        stale = set(compat.stale_trial_ids(self.storage, self.study))
        states: dict[int, str] = {}
        for trial in self.study.get_trials(deepcopy=False):
            if "node" not in trial.user_attrs:
                continue
            if trial.state == TrialState.COMPLETE:
                state = DONE
            elif trial.state != TrialState.RUNNING:
                state = GONE
            else:
                tid = compat.trial_id(self.storage, self.study, trial.number)
                state = GONE if tid in stale or _coordination.dead_here(trial) else ALIVE
            states[int(trial.user_attrs["node"])] = state
        return states

    # ---- runs --------------------------------------------------------------------

    @transient_retry
    def announce(self, config_json: str, timeout_s: float) -> int:
        """A run for the other nodes to join: its number."""
        trial = self.study.ask()
        trial.set_user_attr("config", config_json)
        trial.set_user_attr("timeout_s", timeout_s)
        return trial.number

    @transient_retry
    def announced(self, after: int) -> list[tuple[int, str, float]]:
        """Runs announced after run `after` and not yet closed: (number, config, timeout)."""
        return [
            (t.number, str(t.user_attrs["config"]), float(t.user_attrs["timeout_s"]))
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.number > after and "config" in t.user_attrs
        ]

    @transient_retry
    def report(self, number: int, node_rank: int, results: dict[int, str]) -> None:
        """A node's ranks' results (rank -> TrialResult JSON) on the run it joined."""
        tid = compat.trial_id(self.storage, self.study, number)
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            self.storage.set_trial_user_attr(tid, f"node{node_rank}", json.dumps(results))

    @transient_retry
    def reports(self, number: int) -> dict[int, dict[int, str]]:
        """What each node reported on run `number`: node rank -> its ranks' results."""
        attrs = self.study.get_trials(deepcopy=False)[number].user_attrs
        return {
            int(key[4:]): {int(rank): text for rank, text in json.loads(value).items()}
            for key, value in attrs.items()
            if key.startswith("node") and key[4:].isdigit()
        }

    @transient_retry
    def close(self, number: int) -> None:
        """The run is over: no node joins it any more."""
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError, ValueError):
            self.study.tell(number, 0.0)
