"""The study loop: propose, skip what is known, probe in a child, record; then select, export."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import optuna
from optuna.trial import TrialState

from autotune.store import study as studies
from autotune.core.errors import AutotuneError, NoFitError
from autotune.search.estimate import FAR_OVER, make_predictor
from autotune.views.export import export_selected
from autotune.launch.forkserver import ForkServer
from autotune.launch.runner import run_trial
from autotune.search.selection import fitting, ranked
from autotune.search.skips import open_candidates, skip_reason
from autotune.core.space import seed_candidates
from autotune.core.spec import SearchSpec
from autotune.store.study import TrialRecord
from autotune.core.trial import Candidate, Outcome, TrialConfig, TrialResult
from autotune.core.units import format_size


@dataclasses.dataclass(frozen=True)
class SearchLimits:
    max_trials: int = 20  # probes launched in the whole study (resumes count earlier ones)
    time_budget_s: float | None = None  # no new probe starts after this
    trial_timeout_s: float = 600.0
    confirm_top: int = 3  # finalists measured again before selection (0: none)
    confirm_steps: int = 10  # measured steps of a confirmation run
    # With confirmation on, the search stops proposing at this share of the time budget.
    search_share: float = 0.8
    fork_server: bool = True  # children forked from a pre-imported server
    # How many probes share this machine's cores at a time (--parallel on the CPU);
    # recorded with each result, so figures measured side by side are told apart.
    concurrent: int = 1
    poll_s: float = 2.0  # how often a worker waiting on other workers' trials looks again
    explore: bool = True  # propose and probe (off: only confirm and export)
    conclude: bool = True  # confirm the finalists and export (off: a --parallel worker)


@dataclasses.dataclass(frozen=True)
class SearchReport:
    study_name: str
    best: TrialRecord | None
    records: tuple[TrialRecord, ...]
    probes_this_run: int
    elapsed_s: float
    output: Path | None
    stop_reason: str


class Observer(Protocol):
    def on_search_start(self, spec: SearchSpec, study_name: str, limits: SearchLimits) -> None: ...
    def on_trial_start(self, number: int, candidate: Candidate) -> None: ...
    def on_trial_end(self, number: int, candidate: Candidate, result: TrialResult) -> None: ...
    def on_confirm(self, number: int, candidate: Candidate, result: TrialResult) -> None: ...
    def on_search_end(self, report: SearchReport) -> None: ...


def run_search(
    *,
    spec: SearchSpec,
    study_name: str,
    storage: str,
    studies_dir: Path,
    limits: SearchLimits,
    sampler: str,
    output: Path,
    objective: str,
    observer: Observer,
) -> SearchReport:
    """Search, record every trial in the study, and export the best config to `output`."""
    study = prepare_study(spec=spec, study_name=study_name, storage=storage, sampler=sampler)
    observer.on_search_start(spec, study_name, limits)
    started = time.monotonic()
    probes, stop = 0, ""
    study_dir = studies_dir / study_name
    launcher = Launcher(
        study_dir / "forkserver.log" if limits.fork_server else None,
        data_limit=spec.fit_limit_bytes if spec.device.kind == "cpu" else None,
    )
    try:
        while limits.explore and not stop:
            studies.recover_stale(study)  # a dead worker's trial goes back in the queue
            recs = studies.records(study, spec)
            busy = studies.in_flight(study, spec)
            over = far_over_budget(spec, recs)
            stop = _stop_reason(recs, busy, spec, limits, started, over)
            if stop and busy and limits.conclude:
                # Finalists are chosen from every result: wait for the other workers'
                # trials; go on if one of them died and its config came back.
                while studies.in_flight(study, spec):
                    _wait_for_others(study, limits)
                stop = ""
                continue
            if stop:
                break
            if not open_candidates(spec.space, recs, over, busy):
                _wait_for_others(study, limits)  # what is left is being probed elsewhere
                continue
            probes += _step(study, spec, recs, busy, over, study_dir, limits, observer, launcher)
        if limits.conclude:
            probes += _confirm(study, spec, study_dir, limits, observer, started, launcher)
    finally:
        launcher.close()
    recs = studies.records(study, spec)
    if not limits.conclude:
        return SearchReport(
            study_name, None, tuple(recs), probes, time.monotonic() - started, None, stop
        )
    report = _finish(spec, study_name, recs, probes, started, output, objective, stop)
    observer.on_search_end(report)
    if report.best is None:
        raise NoFitError(_nothing_fits(recs, spec))
    return report


def prepare_study(*, spec: SearchSpec, study_name: str, storage: str, sampler: str) -> optuna.Study:
    """Open (or create) the study, recover dead workers' trials, queue first guesses."""
    study = studies.open_study(
        storage=storage,
        name=study_name,
        spec=spec,
        sampler=studies.make_sampler(sampler, spec.seed),
    )
    studies.recover_stale(study)
    if not study.get_trials(deepcopy=False):  # a worker starting at this moment may do it too
        for seed in seed_candidates(spec.space, spec.device):
            study.enqueue_trial(studies.candidate_params(seed, spec.space))
    return study


def _stop_reason(
    recs: list[TrialRecord],
    busy: dict[Candidate, int],
    spec: SearchSpec,
    limits: SearchLimits,
    started: float,
    over: Callable[[Candidate], str | None],
) -> str:
    """Why no new probe should start ('' to go on). Probes running elsewhere count."""
    if sum(r.result.outcome != Outcome.SKIPPED for r in recs) + len(busy) >= limits.max_trials:
        return f"reached --max-trials {limits.max_trials}"
    share = limits.search_share if limits.confirm_top else 1.0
    if (
        limits.time_budget_s is not None
        and time.monotonic() - started >= share * limits.time_budget_s
    ):
        return "time budget spent" + (" (the rest is for confirmation)" if share < 1 else "")
    if not busy and not open_candidates(spec.space, recs, over):
        return "every config in the space is measured or ruled out"
    return ""


def _wait_for_others(study: optuna.Study, limits: SearchLimits) -> None:
    """Pause while other workers' trials run; take over those whose worker died."""
    time.sleep(limits.poll_s)
    studies.recover_stale(study)


def _step(
    study: optuna.Study,
    spec: SearchSpec,
    recs: list[TrialRecord],
    busy: dict[Candidate, int],
    over: Callable[[Candidate], str | None],
    study_dir: Path,
    limits: SearchLimits,
    observer: Observer,
    launcher: Launcher,
) -> int:
    """Ask for one proposal; skip it or probe it. Returns 1 when a probe ran."""
    trial = studies.ask(study, spec)
    candidate = studies.candidate_of(spec, trial.params)
    skip = skip_reason(candidate, recs, spec.space, over, busy)
    if skip is not None:
        result = TrialResult(Outcome.SKIPPED, reason=skip.reason)
        state = None if skip.implies_oom else TrialState.PRUNED
        studies.tell(study, trial, spec, result, state=state)
        if skip.implies_oom:
            observer.on_trial_end(trial.number, candidate, result)
        else:  # steer the next ask to a config still open
            remaining = open_candidates(spec.space, recs, over, busy)
            if remaining:
                pick = random.Random(spec.seed * 7919 + trial.number).choice(remaining)
                study.enqueue_trial(studies.candidate_params(pick, spec.space))
        return 0
    studies.mark_running(trial, candidate)
    rival = studies.contested(study, trial.number, candidate, limits.max_trials)
    if rival is not None:  # another worker got there first: let it run, pick again
        result = TrialResult(Outcome.SKIPPED, reason=rival)
        studies.tell(study, trial, spec, result, state=TrialState.PRUNED)
        time.sleep(random.uniform(0.0, 0.5))  # two yielding workers do not retry in step
        return 0
    config = _trial_config(
        spec, trial.number, candidate, study_dir / "trials" / str(trial.number), limits.concurrent
    )
    observer.on_trial_start(trial.number, candidate)
    try:
        with studies.heartbeat(trial):
            result = launcher.run(config, timeout_s=limits.trial_timeout_s)
    except BaseException as exc:  # Ctrl-C, SIGTERM, a full disk: fail the trial, keep the study
        trial.set_user_attr("outcome", "error")
        why = str(exc) if isinstance(exc, AutotuneError) else f"interrupted ({type(exc).__name__})"
        trial.set_user_attr("reason", f"{why}; re-queued")
        study.tell(trial, state=TrialState.FAIL)
        study.enqueue_trial(studies.candidate_params(candidate, spec.space))
        raise
    studies.tell(study, trial, spec, result)
    observer.on_trial_end(trial.number, candidate, result)
    return 1


def far_over_budget(spec: SearchSpec, recs: list[TrialRecord]) -> Callable[[Candidate], str | None]:
    """The estimate's verdict on a candidate: a reason when it is far over the budget."""
    predict = make_predictor(spec, recs)
    limit = FAR_OVER * spec.memory_budget_bytes

    def over(candidate: Candidate) -> str | None:
        peak = predict(candidate)
        if peak is None or peak <= limit:
            return None
        budget = format_size(spec.memory_budget_bytes)
        return f"estimate {format_size(peak)} is far over the {budget} budget"

    return over


class Launcher:
    """Runs probes: forked from a pre-imported server when `server_log` is given (started
    on first use, restarted if it dies), else each in a fresh interpreter."""

    def __init__(self, server_log: Path | None, *, data_limit: int | None) -> None:
        self.server_log = server_log
        self.data_limit = data_limit  # the CPU probe limit, which the server must run under
        self.server: ForkServer | None = None

    def run(self, config: TrialConfig, *, timeout_s: float) -> TrialResult:
        if self.server_log is not None and (
            self.server is None or self.server.process.poll() is not None
        ):
            self.server = ForkServer(self.server_log, data_limit=self.data_limit)
        return run_trial(config, timeout_s=timeout_s, server=self.server)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def _trial_config(
    spec: SearchSpec,
    number: int,
    candidate: Candidate,
    trial_dir: Path,
    concurrent: int,
    measure_steps: int = 0,
) -> TrialConfig:
    return TrialConfig(
        number=number,
        trial_dir=str(trial_dir),
        model=spec.model,
        candidate=candidate,
        device=spec.device.torch_device,
        seq_len=spec.seq_len,
        target_len=spec.target_len,
        memory_budget_bytes=spec.fit_limit_bytes,
        warmup_steps=spec.warmup_steps,
        measure_steps=measure_steps or spec.measure_steps,
        seed=spec.seed,
        base_arguments=spec.base_arguments,
        concurrent=concurrent,
        nproc_per_node=spec.nproc_per_node,
        data_path=spec.data.path if spec.data else "",
        pad_token_id=spec.data.pad_token_id if spec.data else 0,
    )


def _confirm(
    study: optuna.Study,
    spec: SearchSpec,
    study_dir: Path,
    limits: SearchLimits,
    observer: Observer,
    started: float,
    launcher: Launcher,
) -> int:
    """Measure the top finalists again, longer, until each has two runs. Returns runs."""
    runs = 0
    for _ in range(2 * limits.confirm_top):
        if limits.time_budget_s is not None and time.monotonic() - started >= limits.time_budget_s:
            break
        recs = studies.records(study, spec)
        finalists = ranked(fitting(recs, spec.fit_limit_bytes))[: limits.confirm_top]
        todo = [r for r in finalists if r.runs < 2]
        if not todo:
            break
        record = todo[0]
        trial_dir = study_dir / "trials" / f"{record.number}-confirm"
        # Confirmations run one at a time, alone on the machine (concurrent = 1).
        config = _trial_config(
            spec, record.number, record.candidate, trial_dir, 1, limits.confirm_steps
        )
        result = launcher.run(config, timeout_s=limits.trial_timeout_s)
        studies.add_confirmation(study, spec, record, result)
        observer.on_confirm(record.number, record.candidate, result)
        runs += 1
    return runs


def _finish(
    spec: SearchSpec,
    study_name: str,
    recs: list[TrialRecord],
    probes: int,
    started: float,
    output: Path,
    objective: str,
    stop: str,
) -> SearchReport:
    best = export_selected(
        records=recs, spec=spec, study_name=study_name, output=output, objective=objective
    )
    return SearchReport(
        study_name=study_name,
        best=best,
        records=tuple(recs),
        probes_this_run=probes,
        elapsed_s=time.monotonic() - started,
        output=output if best else None,
        stop_reason=stop,
    )


def _nothing_fits(recs: list[TrialRecord], spec: SearchSpec) -> str:
    """The one-line report when no config fits: the smallest peak seen and what to try."""
    peaks = [r.result.peak_memory_bytes for r in recs if r.result.peak_memory_bytes]
    counts: dict[str, int] = {}
    for r in recs:
        counts[r.result.outcome.value] = counts.get(r.result.outcome.value, 0) + 1
    seen = ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no trials"
    smallest = f"; smallest peak measured {format_size(min(peaks))}" if peaks else ""
    return (
        f"no config fits {format_size(spec.fit_limit_bytes)} (budget "
        f"{format_size(spec.memory_budget_bytes)} less headroom): {seen}{smallest}; try a larger "
        "--memory-budget, --optimizers adamw_bnb_8bit or adafactor, --checkpointing on, "
        "a shorter --seq-len or a smaller --global-batch-size"
    )
