"""The study loop: take over what other studies measured alike, then propose, skip
what is known, probe in a child, record; then confirm.

One `SearchRun` per search process. `explore` proposes and probes until a limit stops
it; `confirm` measures the finalists again, longer. Selecting and exporting the winner
is the caller's (commands), so a worker that only explores writes nothing else.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import statistics
import time
from pathlib import Path

import optuna

from autotune.core.enums import Objective, Outcome
from autotune.core.errors import AutotuneError, StudyError
from autotune.core.run_events import required
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialConfig, TrialRecord, TrialResult
from autotune.core.units import format_duration
from autotune.hf.training_args import recipe
from autotune.launch.forkserver import EarlyServer, model_to_share
from autotune.launch.runner import Launcher
from autotune.store.keys import Attr
from autotune.store.reuse import Reuse
from autotune.store.samplers import make_sampler
from autotune.store.store import StudyStore, TrialLost
from autotune.system import devices as device
from autotune.tuning._memory_verdict import far_over_budget
from autotune.tuning._propose import Proposal, next_config
from autotune.tuning._skips import Verdictor, open_candidates, skip_reason
from autotune.tuning.deadline import Deadline
from autotune.tuning.guesses import first_guesses, fitted_guess
from autotune.tuning.limits import Observer, SearchLimits
from autotune.tuning.outcome import SearchReport
from autotune.tuning.parity import (
    ParityCheck,
    baseline,
    parity_stop,
    run_s,
)
from autotune.tuning.rehearsal import (
    failure_error,
    job_failure,
    rehearse_first,
    rehearse_selected,
    reserved_s,
)
from autotune.tuning.selection import (
    by_objective,
    compare,
    decided,
    duel_pair,
    exportable,
    fitting,
    incumbent_cost,
    keeping_twin,
    leader,
    select_for,
    verdict,
)
from autotune.tuning.time_plan import plan_parity


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
        self.judge = functools.partial(verdict, spec=self.spec, implied=False)
        # the config to export must pass a rehearsal (the run evaluates or saves)
        self.rehearses = required(self.spec, limits.rehearse)

    # ---- exploring ------------------------------------------------------------------

    def take_over(self) -> None:
        """Record every config another study measured alike and this one has not (lever
        4: a rerun reuses every trial that fits, not only what its sampler proposes)."""
        if self.reuse is not None and len(self.reuse):
            for number, candidate, result in self.store.take_over(self.reuse.found, self.judge):
                self.observer.on_trial_end(number, candidate, result)

    def explore(
        self, deadline: Deadline, *, wait_for_others: bool, end: Deadline | None = None
    ) -> str:
        """Propose and probe until a limit stops it; returns why it stopped.

        `wait_for_others`: before stopping, wait for other workers' running trials (the
        finalists are chosen from every result), and go on if one of them died. `end`:
        the whole time budget's, which no probe may be expected to end past."""
        while True:
            self.store.recover_stale(self.judge)  # a dead worker's trial goes back in the queue
            recs = self.store.records()
            failed = job_failure(recs) if self.rehearses else None
            if failed is not None:  # no config would pass its rehearsal: stop now
                return f"trial {failed.number}'s rehearsal failed in a way no config changes"
            if rehearse_first(self, recs, end or deadline):  # checks first: where the run
                continue  # evaluates, the first config that fits is rehearsed at once
            busy = self.store.in_flight()
            over = far_over_budget(self.spec, recs)
            proposal = self._proposal(recs, busy, over)
            stop = self._stop_reason(recs, busy, deadline, over, end=end) or (
                proposal.why_stop if proposal and not busy else ""
            )
            if stop and busy and wait_for_others:
                while self.store.in_flight():
                    self._pause()
                continue
            if stop:
                return stop
            if not open_candidates(self.spec.space, recs, over, busy):
                self._pause()  # what is left is being probed elsewhere
                continue
            if proposal and not self.store.waiting():
                if proposal.candidate is None:  # the model would stop: see what the
                    self._pause()  # running probes (other workers') report first
                    continue
                self.store.enqueue(proposal.candidate)
            self._step(recs, busy, over)

    def _stop_reason(
        self,
        recs: list[TrialRecord],
        busy: dict[Candidate, int],
        deadline: Deadline,
        over: Verdictor,
        *,
        end: Deadline | None = None,
    ) -> str:
        """Why no new probe should start ('' to go on). Probes running elsewhere count."""
        self.plan_parity(deadline, recs)
        limits = self.limits
        if sum(is_probe(r) for r in recs) + len(busy) >= limits.max_trials:
            return f"reached --max-trials {limits.max_trials}"
        # no answer without one measurement: the first probe runs however late (a study
        # that took measurements over from another has them, and stops on the clock)
        first = not busy and all(r.result.outcome == Outcome.SKIPPED for r in recs)
        if deadline.passed() and not first and not self._reserve_idle(recs, end):
            return "time budget spent" + (
                " (the rest is for confirmation)" if limits.confirm_top else ""
            )
        expected = probe_wall_s(recs)
        # the rehearsal before the export is left its time
        rehearsal = reserved_s(recs, self.spec, expected) if self.rehearses else 0.0
        if (
            not first
            and end is not None
            and (left := end.left()) is not None
            and expected + rehearsal > left
        ):
            also = " and the rehearsal" if rehearsal else ""
            return (
                f"time budget spent: a probe{also} takes about "
                f"{format_duration(expected + rehearsal)} and {format_duration(left)} is left"
            )
        top = limits.confirm_top if limits.parity_top is None else limits.parity_top
        if (
            limits.parity_steps
            and not limits.parity_auto
            and (
                why := parity_stop(
                    self.spec,
                    recs,
                    self.store.parity(),
                    limits.parity_steps,
                    top,
                    limits.objective,
                    deadline.left(),
                )
            )
        ):
            return why
        if not busy and not open_candidates(self.spec.space, recs, over):
            return "every config in the space is measured or ruled out"
        return ""

    def _reserve_idle(self, recs: list[TrialRecord], end: Deadline | None) -> bool:
        """Whether the time kept from exploring would buy nothing: no parity runs are
        planned and no finalist's confirmation fits in what is left of the whole budget.
        Exploring then goes on while a probe fits (a one-minute search here stopped at 50 s
        for a confirmation of 18 s that could never start, and sat idle)."""
        left = end.left() if end is not None else None
        limits = self.limits
        if left is None or not limits.confirm_top or limits.parity_steps or limits.parity_auto:
            return False
        pool = [r for r in fitting(recs, self.spec.fit_limit_bytes) if exportable(r)]
        return bool(pool) and all(self._confirm_s(r) > left for r in pool)

    def plan_parity(
        self, deadline: Deadline, recs: list[TrialRecord], *, final: bool = False
    ) -> None:
        """--parity auto: once the first guesses are measured (`final`: exploring is
        over), the parity runs' length for the time left to explore (`deadline`). The
        study keeps it: a worker's or an earlier run's plan stands."""
        limits = self.limits
        if not limits.parity_auto:
            return
        plan = self.store.parity_plan()
        if plan is not None:
            kind = f"{plan.steps}-step runs" if plan.steps else "the probes' own losses, unverified"
            said = f"parity: {kind}, as this study planned"
        else:
            top = limits.confirm_top if limits.parity_top is None else limits.parity_top
            plan = plan_parity(
                self.spec,
                recs,
                top=top,
                explore_left_s=deadline.left(),
                elapsed_s=time.monotonic() - self.started,
                explore_share=limits.search_share,
                final=final,
            )
            if plan is None:
                return
            plan = self.store.save_parity_plan(plan)
            said = plan.why
        self.limits = dataclasses.replace(
            limits, parity_steps=plan.steps, parity_quick=plan.quick, parity_auto=False
        )
        if said:
            self.observer.on_plan(said)

    def _proposal(
        self, recs: list[TrialRecord], busy: dict[Candidate, int], over: Verdictor
    ) -> Proposal | None:
        """--sampler model: the open config the model of step time finds most promising;
        first, a first guess the estimate ruled out, at a batch that fits (`fitted_guess`),
        then, where the best so far changes the recipe's arithmetic unverified, the same
        config with the recipe's precision and optimizer, which a tie would go to."""
        if not self.limits.propose:
            return None
        opened = open_candidates(self.spec.space, recs, over, busy)
        guess = fitted_guess(self.spec, recs, opened, over.fits, in_flight=busy)
        if guess is not None:
            return Proposal(guess)
        twin = keeping_twin(self.spec, recs)
        if twin is not None and twin in opened:
            return Proposal(twin)
        return next_config(
            self.spec,
            recs,
            opened,
            fits=over.fits,
            concurrent=self.limits.concurrent,
            objective=self.limits.objective,
        )

    def _pause(self) -> None:
        """Wait while other workers' trials run; take over those whose worker died."""
        time.sleep(self.limits.poll_s)
        self.store.recover_stale(self.judge)

    def _step(self, recs: list[TrialRecord], busy: dict[Candidate, int], over: Verdictor) -> None:
        """Ask for one proposal; skip it or probe it."""
        trial, candidate = self.store.ask()
        guess = bool(trial.user_attrs.get(Attr.FIRST_GUESS))
        skip = skip_reason(candidate, recs, self.spec.space, over, busy, first_guess=guess)
        if skip is not None:
            result = TrialResult(Outcome.SKIPPED, reason=skip.reason)
            self.store.tell(trial, result, verdict(result, self.spec, implied=skip.implies_oom))
            if skip.implies_oom or guess:  # the user sees why a queued guess did not run
                self.observer.on_trial_end(trial.number, candidate, result)
            elif not self.store.was_queued(trial):  # the sampler's repeat: steer the next ask
                self._steer(trial.number, recs, over, busy)  # to a config still open
            return
        config = self.trial_config(
            trial.number,
            candidate,
            str(trial.number),
            adaptive=self.limits.adaptive,
            incumbent_s=self._incumbent(recs),
        )
        try:
            rival = self.store.claim(trial, candidate, self.limits.max_trials, config.trial_dir)
        except TrialLost:  # another worker failed it and re-queued its config: ask again
            return
        if rival is not None:  # another worker got there first: let it run, pick again
            result = TrialResult(Outcome.SKIPPED, reason=rival)
            self.store.tell(trial, result, verdict(result, self.spec, implied=False))
            time.sleep(random.uniform(0.0, 0.5))  # two yielding workers do not retry in step
            return
        self._probe(trial, candidate, config)

    def _steer(
        self, number: int, recs: list[TrialRecord], over: Verdictor, busy: dict[Candidate, int]
    ) -> None:
        remaining = open_candidates(self.spec.space, recs, over, busy)
        if remaining:
            self.store.enqueue(random.Random(self.spec.seed * 7919 + number).choice(remaining))

    def _probe(self, trial: optuna.Trial, candidate: Candidate, config: TrialConfig) -> None:
        self.observer.on_trial_start(trial.number, candidate)
        try:
            with self.store.heartbeat(trial):
                result = self.launcher.run(config, timeout_s=self.limits.trial_timeout_s)
        except BaseException as exc:  # Ctrl-C, SIGTERM, a full disk: fail the trial, keep the study
            why = (
                str(exc)
                if isinstance(exc, AutotuneError)
                else f"interrupted ({type(exc).__name__})"
            )
            self.store.fail_and_requeue(trial, candidate, why)
            raise
        self.probes += 1
        try:
            told = self.store.tell(trial, result, self.judge(result))
        except StudyError as exc:  # the storage stayed away: keep the result for the rerun
            try:
                kept = self.store.keep_unrecorded(config.trial_dir, result)
            except OSError:  # the same full disk: the rerun probes the config again
                raise exc from None
            raise StudyError(f"{exc}; trial {trial.number}'s result is kept in {kept}") from None
        if not told:
            lost = "not recorded: another worker took the trial over while the storage was away"
            result = result.replace(reason=f"{result.reason}; {lost}".lstrip("; "))
        self.observer.on_trial_end(trial.number, candidate, result)

    def _incumbent(self, recs: list[TrialRecord]) -> float | None:
        """What a new probe is measured against (adaptive measurement): the best cost so
        far among comparable figures. None where a slower step may still win: ranking
        by throughput per GiB, or the user's data (a sampling order changes only the
        real batches, timed after the worst case)."""
        if not self.limits.adaptive or self.limits.objective != Objective.THROUGHPUT:
            return None
        if self.spec.data is not None:
            return None
        return incumbent_cost(
            recs,
            fit_limit_bytes=self.spec.fit_limit_bytes,
            train_steps=self.spec.train_steps,
            concurrent=self.limits.concurrent,
        )

    # ---- confirming -----------------------------------------------------------------

    def confirm(self, deadline: Deadline) -> int:
        """Measure the top finalists again, longer, until each has two runs, and then the
        plain default (where measured and it fits), so the ratio to it rests on runs
        measured alike; these runs are one round. Then, where the two finalists the
        export hinges on are close, paired rounds between them (`duel`). Returns runs."""
        runs = 0
        first_round = self.store.next_round()
        for _ in range(2 * self.limits.confirm_top + 1 if self.limits.confirm_top else 0):
            if deadline.passed():
                break
            fits = fitting(self.store.records(), self.spec.fit_limit_bytes)
            pool = [r for r in fits if exportable(r)]
            # The config selection would export first, then its rivals by the objective
            # (a config the objective ranks low cannot change the export)
            objective = self.limits.objective
            chosen = select_for(self.spec, pool, objective)
            rivals = by_objective(pool, objective, self.spec.train_steps)
            finalists = [r for r in pool if r == chosen] + [r for r in rivals if r != chosen]
            left = deadline.left()  # a run expected to end past the budget does not start
            # and then what the headline ratio is taken against (their recipe, or the
            # plain default)
            default, _ = baseline(self.spec, pool, None)
            wanted = finalists[: self.limits.confirm_top]
            if default is not None and default.number not in {r.number for r in wanted}:
                wanted.append(default)
            todo = [
                r for r in wanted if r.runs < 2 and (left is None or self._confirm_s(r) <= left)
            ]
            if not todo:
                break
            self._confirm_run(todo[0], first_round, runs)
            runs += 1
        return runs + (self.duel(deadline) if self.limits.confirm_top else 0)

    def duel(self, deadline: Deadline) -> int:
        """Paired, interleaved rounds (A B, then B A) between the two finalists the export
        hinges on (`duel_pair`), while their measurements cannot tell them apart, until
        the rounds' interval says which is faster or that they tie (`settled`), for at
        most --confirm-rounds rounds and as far as the time budget allows. Returns runs."""
        runs, most = 0, self.limits.confirm_rounds
        for _ in range(most + 1 if most >= 2 else 0):  # a pair that changes: bounded too
            fits = fitting(self.store.records(), self.spec.fit_limit_bytes)
            pool = [r for r in fits if exportable(r)]
            pair = duel_pair(self.spec, pool, self.limits.objective)
            if pair is None:
                return runs
            a, b = pair
            ratio = compare(a, b)
            together = len(dict(a.rounds).keys() & dict(b.rounds).keys())
            left = deadline.left()
            if (
                decided(a, b, self.spec, self.limits.objective)
                or together >= most
                or (left is not None and self._confirm_s(a) + self._confirm_s(b) > left)
            ):
                if together >= 2 and ratio is not None:
                    self.observer.on_plan(
                        f"paired rounds: trial {a.number} against trial {b.number}: "
                        f"{ratio.describe()}"
                    )
                return runs
            number = self.store.next_round()
            for record in (a, b) if number % 2 == 0 else (b, a):  # neither always first
                self._confirm_run(record, number, runs)
                runs += 1
        return runs

    def _confirm_s(self, record: TrialRecord) -> float:
        """What a confirmation run of `record` is expected to take."""
        return run_s(record.result, self.spec.warmup_steps + self.limits.confirm_steps, 1)

    def _confirm_run(self, record: TrialRecord, round_number: int, runs: int) -> None:
        """One confirmation run, in its own folder, alone (concurrent 1), stored with its
        round."""
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{round_number}-{runs}"
        config = self.trial_config(
            record.number,
            record.candidate,
            f"{record.number}-confirm-{stamp}",
            concurrent=1,
            measure_steps=self.limits.confirm_steps,
        )
        result = self.launcher.run(config, timeout_s=self.limits.trial_timeout_s)
        judged = verdict(result, self.spec, implied=False)
        self.store.add_confirmation(record, result, judged, config.trial_dir, round_number)
        self.observer.on_confirm(record.number, record.candidate, result)
        self.probes += 1

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
        spec = self.spec
        torch_device, visible = device.placement(spec.device, spec.nproc_per_node)
        return TrialConfig(
            number=number,
            trial_dir=str(self.study_dir / "trials" / folder),
            model=spec.model,
            candidate=candidate,
            device=torch_device,
            visible_devices=visible,
            min_measure_s=device.min_window_s(spec.device.kind),
            seq_len=spec.trained_len(candidate),
            target_len=spec.target_len,
            memory_limit_bytes=spec.fit_limit_bytes,
            warmup_steps=spec.warmup_steps,
            measure_steps=measure_steps or spec.measure_steps,
            seed=spec.seed,
            training_arguments=recipe(spec, candidate),
            concurrent=concurrent or self.limits.concurrent,
            nproc_per_node=spec.nproc_per_node,
            data_path=spec.data.path if spec.data else "",
            own_batches=spec.own_batches,
            longest_samples=spec.longest_samples,
            sample_tokens=spec.sample_tokens if candidate.changes_samples else 0.0,
            pad_token_id=spec.data.pad_token_id if spec.data else 0,
            adaptive=adaptive,
            incumbent_s=incumbent_s,
            train_steps=spec.train_steps,
        )


def probe_wall_s(records: list[TrialRecord]) -> float:
    """What a new probe is expected to take, start to end: the median wall time of this
    study's probes that ran to their end (one out of memory stops early, and the next
    may fit), of all its probes before any did (0 before any)."""
    probes = [r for r in records if is_probe(r) and r.result.phases_s.get("wall", 0.0) > 0]
    ended = [r for r in probes if r.result.outcome == Outcome.OK] or probes
    return statistics.median(r.result.phases_s["wall"] for r in ended) if ended else 0.0


def is_probe(record: TrialRecord) -> bool:
    """A trial --max-trials counts: one that ran (not skipped, not reused)."""
    return record.result.outcome != Outcome.SKIPPED and not record.result.reused_from


def prepare_store(*, spec: SearchSpec, study_name: str, storage: str, sampler: str) -> StudyStore:
    """Open (or create) the study, recover dead workers' trials, queue first guesses."""

    store = StudyStore.open(
        url=storage, name=study_name, spec=spec, sampler=make_sampler(sampler, spec.seed)
    )
    store.recover_stale(functools.partial(verdict, spec=spec, implied=False))
    if store.is_empty():  # a worker starting at this moment may do it too
        # the recipe first: what the user would run is the baseline every change is
        # weighed against (a 1-minute QLoRA search on an H100 probed only the plain
        # default, and exported its change of their precision and optimizer)
        for seed in first_guesses(spec):
            store.enqueue(seed, first_guess=True)
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
            run.take_over()
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
    run.plan_parity(checks, store.records(), final=True)  # if exploring did not
    if run.limits.parity_check:  # within the time budget: exploring left them room
        check = ParityCheck(run, run.limits)
        check.settle(checks)
    run.confirm(checks)
    if check is not None:
        check.settle(checks)
    if rehearse:  # none is exported unrehearsed
        rehearse_selected(run, deadline)
