"""The search as phases: exploring (`tuning.exploring`, until the stop rule of
`tuning.stopping` says stop), planning and settling parity (`tuning.parity`), confirming
and the paired rounds (`tuning.confirming`), and the rehearsal (`tuning.rehearsal`).

One `SearchRun` per search process holds what the phases share: the store, the spec,
the limits, the observer and the launcher. Selecting and exporting the winner is the
caller's (commands), so a worker that only explores writes nothing else.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path

from autotune.core.run_events import required
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialConfig, TrialResult, Verdict
from autotune.launch.forkserver import EarlyServer, model_to_share
from autotune.launch.runner import Launcher, Peers
from autotune.store.reuse import Reuse
from autotune.store.samplers import make_sampler
from autotune.store.store import StudyStore
from autotune.tuning import confirming, exploring
from autotune.tuning.deadline import Deadline
from autotune.tuning.guesses import first_guesses
from autotune.tuning.limits import Observer, SearchLimits
from autotune.tuning.outcome import SearchReport
from autotune.tuning.parity import ParityCheck
from autotune.tuning.probe_config import probe_config
from autotune.tuning.rehearsal import failure_error, job_failure, rehearse_selected, reserved_s
from autotune.tuning.selection import leader, select_for, verdict
from autotune.tuning.stopping import is_probe


class SearchRun:
    """One searching process on one study."""

    def __init__(
        self,
        *,
        store: StudyStore,
        study_dir: Path,
        limits: SearchLimits,
        observer: Observer,
        launcher: Launcher,
        reuse: Reuse | None = None,
    ) -> None:
        self.store = store
        self.reuse = reuse  # other studies' measurements of this search's configs
        self.spec = store.spec
        self.study_dir = study_dir
        self.limits = limits
        self.observer = observer
        self.launcher = launcher
        self.probes = 0  # launched by this process
        self.started = time.monotonic()
        self.judge: Callable[[TrialResult], Verdict] = functools.partial(
            verdict, spec=self.spec, implied=False
        )
        # the config to export must pass a rehearsal (the run evaluates or saves)
        self.rehearses = required(self.spec, limits.rehearse)
        self.said: set[str] = set()  # lines said once this run

    # ---- the phases, each in its own module ------------------------------------------

    def explore(
        self, deadline: Deadline, *, wait_for_others: bool, end: Deadline | None = None
    ) -> str:
        """Propose and probe until the stop rule says stop (`exploring.explore`); returns
        why it stopped."""
        return exploring.explore(self, deadline, wait_for_others=wait_for_others, end=end)

    def confirm(self, deadline: Deadline) -> int:
        """The finalists measured again, then the paired rounds (`confirming`)."""
        runs = confirming.confirm(self, deadline)
        self.probes += runs
        return runs

    def trial_config(
        self,
        number: int,
        candidate: Candidate,
        folder: str,
        *,
        measure_steps: int = 0,
        concurrent: int = 0,
        adaptive: bool = False,
        incumbent_s: float | None = None,
    ) -> TrialConfig:
        """A probe's config of this study, its files in the study's `folder`."""
        return probe_config(
            self.spec,
            number,
            candidate,
            trial_dir=str(self.study_dir / "trials" / folder),
            concurrent=concurrent or self.limits.concurrent,
            measure_steps=measure_steps,
            adaptive=adaptive,
            incumbent_s=incumbent_s,
        )


def prepare_store(*, spec: SearchSpec, study_name: str, storage: str, sampler: str) -> StudyStore:
    """Open (or create) the study, recover dead workers' trials, queue first guesses."""

    store = StudyStore.open(
        url=storage, name=study_name, spec=spec, sampler=make_sampler(sampler, spec.seed)
    )
    store.queue.recover_stale(functools.partial(verdict, spec=spec, implied=False))
    if store.queue.is_empty():  # a worker starting at this moment may do it too
        # the recipe first: what the user would run is the baseline every change is
        # weighed against (a 1-minute QLoRA search on an H100 probed only the plain
        # default, and exported its change of their precision and optimizer)
        for seed in first_guesses(spec):
            store.queue.enqueue(seed, first_guess=True)
    return store


def run_search(
    *,
    store: StudyStore,
    study_dir: Path,
    limits: SearchLimits,
    deadline: Deadline,
    observer: Observer,
    explore: bool = True,
    confirm: bool = True,
    early: EarlyServer | None = None,
    peers: Peers | None = None,
) -> SearchReport:
    """Explore (until --max-trials, the time budget's search share less the parity runs'
    expected time, or an exhausted space), run the parity runs and confirm the finalists
    (until the whole time budget); no export."""
    started = time.monotonic()
    done = sum(is_probe(r) for r in store.records())
    observer.on_search_start(store.spec, store.name, limits, done)
    launcher = Launcher(
        store.spec.device.kind,
        study_dir / "forkserver.log" if limits.fork_server else None,
        shared=model_to_share(store.spec, limits.concurrent),
        early=early,
        peers=peers,
    )
    run = SearchRun(
        store=store,
        study_dir=study_dir,
        limits=limits,
        observer=observer,
        launcher=launcher,
        reuse=Reuse.gather(store, concurrent=limits.concurrent, whole_windows=not limits.adaptive)
        if limits.reuse
        else None,
    )
    stop = ""
    try:
        if explore:
            exploring.take_over(run)
            share = limits.search_share if limits.confirm_top and confirm else 1.0
            stop = run.explore(deadline.share(share), wait_for_others=confirm, end=deadline)
        if confirm:
            _finish(run, deadline)
    finally:
        launcher.close()
    return SearchReport(
        store.name, tuple(store.records()), run.probes, time.monotonic() - started, stop
    )


def _finish(run: SearchRun, deadline: Deadline) -> None:
    """After exploring: a rehearsal failure no config changes is raised at once; then
    parity (only configs that may be exported are confirmed), confirmation, parity again
    (confirmation may reorder the finalists) within the time the rehearsal's reserve
    leaves (none where the export and the change the paired rounds weigh are rehearsed
    already), and the rehearsal of the config to export, however late."""
    store, rehearse = run.store, run.rehearses
    records = store.records()
    if rehearse and (failed := job_failure(records)) is not None:
        raise failure_error(failed)  # found while exploring: said at once
    objective = run.limits.objective
    contenders = (
        select_for(store.spec, records, objective),
        leader(store.spec, records, objective),
    )
    pending = [r for r in contenders if r and not (r.rehearsal and r.rehearsal.clears)]
    reserve = reserved_s(records, store.spec, 0.0) if rehearse and pending else 0.0
    checks = deadline.less(reserve)
    check = None
    exploring.plan_parity(run, checks, store.records(), final=True)  # if exploring did not
    if run.limits.parity_check:  # within the time budget: exploring left them room
        check = ParityCheck(run, run.limits)
        check.settle(checks)
    run.confirm(checks)
    if check is not None:
        check.settle(checks)
    if rehearse:  # none is exported unrehearsed
        rehearse_selected(run, deadline)
