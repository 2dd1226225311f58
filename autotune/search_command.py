"""The search command: options -> plan (SearchSpec) -> the study loop -> selection ->
export, and what it hands back (`SearchOutcome`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console

from autotune.commands import resolve_storage
from autotune.core.errors import StudyError, UsageError
from autotune.core.levers import TORCH_COMPILE
from autotune.core.nodes import nodes_of
from autotune.core.parity_state import ParityState
from autotune.core.paths import (
    check_study_name,
    claim_folder,
    default_study_name,
    searching,
    study_folder,
)
from autotune.core.spec import SearchSpec
from autotune.core.trial import TrialRecord
from autotune.hf.factory import resolve_reference
from autotune.hf.levers import parse_lever_options
from autotune.launch.forkserver import EarlyServer
from autotune.launch.runner import Peers
from autotune.store.nodes import NodeChannel
from autotune.store.storage import heartbeat_s, is_journal, patience_s
from autotune.store.store import StudyStore, stored_spec
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.tuning.nodes import HeadPeers, follow
from autotune.tuning.options import SearchOptions
from autotune.tuning.outcome import SearchOutcome, SearchReport
from autotune.tuning.parity import baseline
from autotune.tuning.plan import Layout, build_spec
from autotune.tuning.rehearsal import plan_line as rehearsal_line
from autotune.tuning.resolve import DataOptions
from autotune.tuning.run import prepare_store, run_search
from autotune.tuning.selection import compare, nothing_fits
from autotune.tuning.time_plan import plan_for_budget
from autotune.tuning.workers import run_workers
from autotune.views.export import (
    export_selected,
    parity_summary,
    previous_export,
    run_changes,
)
from autotune.views.progress import Progress


def search_command(
    options: SearchOptions, *, studies_dir: Path, log_to_stderr: bool = False
) -> SearchOutcome:
    """Search, record every trial in the study, export the best config; the one path of
    `autotune search` and `autotune.search`. `log_to_stderr`: the progress on stderr
    (the CLI's --format json keeps stdout for the result)."""

    o = _what_to_tune(options)
    nodes = nodes_of(o.nnodes, o.node_rank, o.rdzv_endpoint)
    if not nodes.is_head:
        raise UsageError(
            f"--node-rank {nodes.rank} follows the head's search: run it with the CLI "
            "(`autotune search`) on that node"
        )
    heartbeat_s()  # settings from the environment, checked before anything is written
    patience_s()
    deadline = Deadline.after(o.budget_s)  # the whole command's, surveying and planning too
    name = check_study_name(o.study_name or default_study_name(_job_name(o)))
    url = resolve_storage(o.storage, studies_dir)
    folder = study_folder(studies_dir, name, url)
    output = o.output or studies_dir / f"{folder.name}.best.json"
    previous_export(output, force=o.force)  # refuse now, not after the search
    claim_folder(folder, name, url, write=False)  # before the data is tokenized into it
    # its imports (seconds) overlap the model's resolution, the study's opening, the plan
    # workers and DDP probes start afresh
    alone = o.parallel == 1 and not o.devices and o.nproc_per_node * o.nnodes == 1
    early = EarlyServer() if o.fork_server and alone else None
    try:
        if not nodes.many:
            return _prepare_and_search(o, deadline, name, url, folder, output, log_to_stderr, early)
        _ensure_storage_folder(url)
        channel = NodeChannel.open(url, name)
        peers = HeadPeers(channel, nodes)
        with channel.present(nodes.rank):  # the followers follow while the head is present
            peers.wait_for_followers()
            return _prepare_and_search(
                o, deadline, name, url, folder, output, log_to_stderr, early, peers
            )
    finally:
        if early is not None:  # the search's launcher took it, or it is not needed
            early.discard()


def _prepare_and_search(
    o: SearchOptions,
    deadline: Deadline,
    name: str,
    url: str,
    folder: Path,
    output: Path,
    log_to_stderr: bool,
    early: EarlyServer | None,
    peers: Peers | None = None,
) -> SearchOutcome:
    """The spec and plan, the study, then the search (its workers', or its own; `peers`:
    the other nodes of a search across nodes)."""
    spec, slots, notes = build_spec(o, dataset=_data(o, folder), layout=Layout.of(o), server=early)
    spec, plan = plan_for_budget(
        spec,
        budget_s=o.budget_s,
        explore_share=SearchLimits.search_share if o.confirm_top else 1.0,
        steps_asked=o.measure_steps is not None,
        compile_asked=TORCH_COMPILE.name in parse_lever_options(o.levers),
        stored=stored_spec(url=url, name=name),
        default_budget=o.time_budget is None,
    )
    notes += plan
    notes.append(rehearsal_line(spec, rehearse=o.rehearse))
    _ensure_storage_folder(url)
    store = prepare_store(spec=spec, study_name=name, storage=url, sampler=o.sampler)
    store.settings.save_objective(o.objective)
    store.settings.save_rehearse(o.rehearse)  # export, show and load gate on it as this search does
    claim_folder(folder, name, url)
    limits = o.limits(spec.measure_steps)
    with searching(folder):  # export and show say what they read is the best so far
        if slots:
            run_workers(
                spec=spec,
                slots=slots,
                study_name=name,
                storage=url,
                study_dir=folder,
                sampler=o.sampler,
                limits=limits,
                deadline=deadline,
            )
        live = not o.quiet and not slots
        search = _Search(store, folder, limits, deadline, not slots, live, early, peers)
        return search.run(output, force=o.force, log_to_stderr=log_to_stderr, notes=notes)


def follow_command(options: SearchOptions, *, studies_dir: Path) -> str:
    """A node other than the head of a search across nodes: it joins each run the head
    announces in the study's storage, until the head's search ends; what ended it."""
    o = _what_to_tune(options)
    nodes = nodes_of(o.nnodes, o.node_rank, o.rdzv_endpoint)
    heartbeat_s()
    patience_s()
    name = check_study_name(o.study_name or default_study_name(_job_name(o)))
    url = resolve_storage(o.storage, studies_dir)
    folder = study_folder(studies_dir, name, url)
    _ensure_storage_folder(url)
    return follow(NodeChannel.open(url, name), nodes, folder)


def is_follower(options: SearchOptions) -> bool:
    """Whether this search follows another node's (--nnodes with a --node-rank not 0)."""
    return not nodes_of(options.nnodes, options.node_rank, options.rdzv_endpoint).is_head


def _what_to_tune(o: SearchOptions) -> SearchOptions:
    """Exactly one of --trainer (the user's job) and --model (a stand-in); a factory
    script's path made absolute, as probes started elsewhere must find it."""
    if bool(o.trainer) == bool(o.model):
        raise UsageError(
            "give --trainer FILE.py:FUNCTION (your own Trainer factory) or --model NAME "
            "(a stand-in built from a config)" + (", not both" if o.trainer else "")
        )
    if o.args_class and not o.trainer:
        raise UsageError("--args-class names your factory's arguments class: it needs --trainer")
    if o.trainer:
        return dataclasses.replace(o, trainer=resolve_reference(o.trainer))
    return o


def _job_name(o: SearchOptions) -> str:
    """What a study is named after: the model, or the factory's script or module."""
    if o.model:
        return o.model
    location = (o.trainer or "").rpartition(":")[0]
    if location.endswith((".py", ".pkl")):  # a script, or a notebook's pickled factory
        return Path(location).stem
    return location.rsplit(".", 1)[-1]


def _data(o: SearchOptions, folder: Path) -> DataOptions | None:
    """--dataset and its companions (refused without it); tokenized under the study."""
    if o.dataset is None:
        if o.text_column or o.target_column or o.tokenizer:
            raise UsageError("--text-column, --target-column and --tokenizer need --dataset")
        return None
    return DataOptions(
        o.dataset, o.dataset_split, o.text_column, o.target_column, o.tokenizer, folder / "data"
    )


@dataclasses.dataclass(frozen=True)
class _Search:
    """The parent's part of a prepared search: explore (unless workers did), confirm,
    select, export."""

    store: StudyStore
    folder: Path
    limits: SearchLimits
    deadline: Deadline
    explore: bool
    live: bool
    early: EarlyServer | None  # a fork server started ahead, for the search's probes
    peers: Peers | None  # the other nodes, for a search across nodes

    def run(
        self, output: Path, *, force: bool, log_to_stderr: bool, notes: list[str]
    ) -> SearchOutcome:
        spec, name = self.store.spec, self.store.name
        console = Console(highlight=False, soft_wrap=True, stderr=log_to_stderr, markup=False)
        progress = Progress(console, live=self.live, deadline=self.deadline, notes=notes)
        try:
            report = run_search(
                store=self.store,
                study_dir=self.folder,
                limits=self.limits,
                deadline=self.deadline,
                observer=progress,
                explore=self.explore,
                early=self.early,
                peers=self.peers,
            )
            parity = self.store.settings.parity() if self.limits.parity_check else None
            records = list(report.records)
            if parity is None:  # --parity off: verdicts of earlier runs do not apply either
                records = [dataclasses.replace(r, parity=None) for r in records]
            best = export_selected(
                records=records,
                spec=spec,
                study_name=name,
                output=output,
                objective=self.limits.objective,
                validate=True,
                force=force,
                parity=parity,
                rehearse=self.limits.rehearse,
            )
            progress.on_search_end(report)
        finally:
            progress.close()
        return _outcome(name, best, records, parity, report, output, spec, self.limits.rehearse)


def _outcome(
    name: str,
    best: TrialRecord | None,
    records: list[TrialRecord],
    parity: ParityState | None,
    report: SearchReport,
    output: Path,
    spec: SearchSpec,
    rehearse: bool,
) -> SearchOutcome:
    """What the search hands back: the export, what it changed against your recipe and
    its speed over your recipe as measured (else the plain default); raises when nothing
    fits."""
    if best is None:
        raise nothing_fits(records, spec, rehearse=rehearse)
    changed = parity_summary(best, spec, records, parity, rehearse=rehearse)
    default, against = baseline(spec, records, parity)
    ratio = compare(best, default) if default and default != best else None
    return SearchOutcome(
        name,
        best,
        output,
        report.probes_this_run,
        report.elapsed_s,
        report.stop_reason,
        changed,
        spec.train_steps,
        default=default,
        versus_default=ratio,
        baseline=against,
        args_class=spec.model.args_class,
        script_changes=tuple(run_changes(best, spec)),
    )


def _ensure_storage_folder(url: str) -> None:
    """The folder of a SQLite file or a journal file, made where it is not there."""
    if not url.startswith("sqlite:///") and not is_journal(url):
        return
    folder = Path(url.removeprefix("sqlite:///")).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StudyError(
            f"cannot open storage {url!r}: cannot create {folder} ({exc.strerror})"
        ) from None
