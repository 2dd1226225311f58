"""The command line: parse and validate options, then call one library function each."""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from autotune.cli_types import (
    STUDY_OBJECTIVE,
    TABLE_OR_JSON,
    GroupedCommand,
    ListType,
    adapter_options,
    search_options,
    study_options,
)
from autotune.core.enums import DeviceKind, Objective, Precision, Task, values
from autotune.core.errors import AutotuneError, Terminated, raise_terminated
from autotune.core.paths import DEFAULT_STUDIES, searches_running, study_folder
from autotune.core.units import format_size
from autotune.doctor import Check
from autotune.tuning.options import SearchOptions
from autotune.views.doctor import print_report, progress_line
from autotune.views.estimate_table import estimate_json, print_estimate
from autotune.views.show import print_view
from autotune.views.summary import change_lines, finish_lines, outcome_json, versus_line

# Deferred imports: each command imports what it runs (Optuna, the planner, torch), so --help
# and a bad option answer at once


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="trainer-autotune")
def cli(debug: bool) -> None:
    """Find the fastest TrainingArguments that fit in memory, by measuring them."""


@cli.command(cls=GroupedCommand)
@search_options
def search(**options: Any) -> None:
    """Search configs for a model and export the fastest that fits."""
    from autotune.search_command import follow_command, is_follower, search_command

    # SIGTERM unwinds like Ctrl-C, so the running trial's process group is killed and
    # the trial is failed and re-queued (other commands keep the default: just exit).
    # The handler before it comes back after, for a caller that runs the command in its
    # own process (a test's CliRunner).
    before = signal.signal(signal.SIGTERM, raise_terminated)
    fmt = options.pop("fmt")
    asked = SearchOptions(**{**options, "objective": Objective(options["objective"])})
    if is_follower(asked):  # a node other than the head: it follows, the head exports
        try:
            click.echo(
                f"node {asked.node_rank}: {follow_command(asked, studies_dir=DEFAULT_STUDIES)}"
            )
        finally:
            signal.signal(signal.SIGTERM, before)
        return
    try:
        outcome = search_command(asked, studies_dir=DEFAULT_STUDIES, log_to_stderr=fmt == "json")
    finally:
        signal.signal(signal.SIGTERM, before)
    best = outcome.best
    if fmt == "json":
        click.echo(outcome_json(outcome))
        return
    console = Console(highlight=False, soft_wrap=True, markup=False)
    sps, peak = best.result.samples_per_s or 0.0, best.result.peak_memory_bytes or 0
    per_gib = ""
    if asked.objective == Objective.EFFICIENCY and peak:
        per_gib = f" ({sps / (peak / 2**30):.2f} samples/s per GiB: the best per memory)"
    console.print(
        f"best: trial {best.number}: {best.candidate.describe()}: {sps:.2f} samples/s, "
        f"peak {format_size(peak)}{per_gib}"
    )

    lines = [*versus_line(outcome), *finish_lines(outcome.best, outcome.train_steps)]
    lines += [f"in your script: {line}" for line in outcome.script_changes]
    for line in [*lines, *change_lines(outcome.parity)]:
        console.print(line)
    console.print(f"wrote {outcome.output}")


@cli.command()
@click.option("--model", required=True, help="Local directory, hub id, or bundled preset.")
@click.option(
    "--task",
    default="auto",
    type=click.Choice(["auto", *values(Task)]),
    help="What the model is trained for (auto: from its config's architectures).",
)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--seq-len", type=click.IntRange(1), help="[default: min(512, model limit)]")
@click.option(
    "--target-len",
    default=128,
    show_default=True,
    type=click.IntRange(1),
    help="Longest target (seq2seq only).",
)
@click.option(
    "--batch", default=8, show_default=True, type=click.IntRange(1), help="Per-device batch size."
)
@click.option(
    "--precisions",
    type=ListType(tuple(values(Precision))),
    help="Comma-separated, from fp32, tf32, fp16, bf16 [default: all the device supports].",
)
@click.option("--optimizers", type=ListType(), help="TrainingArguments optim names.")
@adapter_options
@TABLE_OR_JSON
def estimate(fmt: str, **options: Any) -> None:
    """Memory estimate per precision/optimizer/checkpointing, without running anything."""
    from autotune.commands import estimate_command

    estimate = estimate_command(**options)
    if fmt == "json":
        click.echo(estimate_json(estimate))
    else:
        print_estimate(estimate)


@cli.command()
@study_options
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    help="[default: studies/<study>.best.json; with another --storage than the default, "
    "studies/<study>-<storage key>.best.json]",
)
@click.option(
    "--format",
    "fmt",
    default="json",
    show_default=True,
    type=click.Choice(["json", "cli"]),
    help="json: write the file; cli: print the tuned fields as flags.",
)
@click.option(
    "--merge-into",
    type=click.Path(path_type=Path),
    help="Replace only the tuned fields in this arguments JSON of yours.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace --output even if autotune did not write it (never a database).",
)
@click.option(
    "--for-device",
    type=click.Choice(values(DeviceKind)),
    help="With --merge-into or --format cli: the device your run trains on, when it is not "
    "the one the study was tuned on (device-specific fields such as use_cpu follow it).",
)
@STUDY_OBJECTIVE
def export(
    study_name: str,
    storage: str | None,
    output: Path | None,
    fmt: str,
    merge_into: Path | None,
    force: bool,
    for_device: str | None,
    objective: str | None,
) -> None:
    """Write the best config of a stored study as TrainingArguments JSON."""
    from autotune import commands

    if fmt == "cli" and (output is not None or merge_into is not None):
        raise click.UsageError(
            "--format cli prints flags; it writes no file: drop --output "
            "and --merge-into, or drop --format cli"
        )
    if output is not None and merge_into is not None:
        raise click.UsageError("give --output (a new file) or --merge-into (your file), not both")
    url = commands.resolve_storage(storage, DEFAULT_STUDIES)
    goal = Objective(objective) if objective else None  # None: the study's
    target = DeviceKind(for_device) if for_device else None
    if for_device and fmt != "cli" and merge_into is None:
        raise click.UsageError(
            "--for-device goes with --merge-into or --format cli; the JSON export is what "
            "was measured, on the device it was measured on"
        )
    if fmt == "cli":
        flags, notes = commands.flags_command(
            study_name=study_name, storage=url, objective=goal, for_device=target
        )
        click.echo(flags)
    elif merge_into is not None:
        changed, notes = commands.merge_command(
            study_name=study_name,
            storage=url,
            objective=goal,
            merge_into=merge_into,
            for_device=target,
        )
        diff = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items()) or "nothing"
        click.echo(f"updated {merge_into}: {diff}")
    else:
        folder = study_folder(DEFAULT_STUDIES, study_name, url)
        path = commands.export_command(
            study_name=study_name,
            storage=url,
            objective=goal,
            output=output or DEFAULT_STUDIES / f"{folder.name}.best.json",
            force=force,
        )
        click.echo(f"wrote {path}")
        from autotune.views.export import written_script_changes

        notes = [f"in your script: {line}" for line in written_script_changes(path)]
    notes += _still_searching(study_folder(DEFAULT_STUDIES, study_name, url))
    for note in notes:
        click.echo(f"note: {note}", err=True)


def _still_searching(folder: Path) -> list[str]:
    """A note when a search of the study is running: an export is its best so far."""
    running = searches_running(folder)
    if not running:
        return []
    return [
        f"a search of this study is still running ({', '.join(running)}): this is its best "
        "so far, and it exports again when it ends"
    ]


@cli.command()
@study_options
@TABLE_OR_JSON
@STUDY_OBJECTIVE
def show(study_name: str, storage: str | None, fmt: str, objective: str | None) -> None:
    """Every trial of a study, best first, and why each non-ok trial failed."""
    from autotune import commands

    view = commands.show_command(
        study_name=study_name,
        storage=commands.resolve_storage(storage, DEFAULT_STUDIES),
        objective=Objective(objective) if objective else None,
    )
    print_view(view, fmt)


@cli.command()
@study_options
@click.option(
    "--output-dir",
    type=click.Path(path_type=Path),
    default=DEFAULT_STUDIES,
    show_default=True,
    help="Where the HTML page and the PNG charts go.",
)
@STUDY_OBJECTIVE
def report(study_name: str, storage: str | None, output_dir: Path, objective: str | None) -> None:
    """An HTML page and PNG charts: throughput against memory, and by batch size."""
    from autotune import commands

    for path in commands.report_command(
        study_name=study_name,
        storage=commands.resolve_storage(storage, DEFAULT_STUDIES),
        output_dir=output_dir,
        objective=Objective(objective) if objective else None,
    ):
        click.echo(f"wrote {path}")


@cli.command()
@study_options
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to serve on; loopback only unless --allow-remote.",
)
@click.option(
    "--port",
    default=8080,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Port to serve on.",
)
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Serve on a non-loopback --host. optuna-dashboard has no authentication and "
    "its API can delete or rename any study in the storage: only on a trusted network.",
)
def dashboard(
    study_name: str, storage: str | None, host: str, port: int, allow_remote: bool
) -> None:
    """Review the study in optuna-dashboard (serves until Ctrl-C)."""

    from autotune import commands

    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not allow_remote:
        raise click.UsageError(
            f"--host {host} would serve the study to the network without authentication "
            "(anyone reaching it can delete studies); add --allow-remote if you mean it"
        )

    commands.dashboard_command(
        study_name=study_name,
        storage=commands.resolve_storage(storage, DEFAULT_STUDIES),
        host=host,
        port=port,
    )


@cli.command()
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@TABLE_OR_JSON
def doctor(device: str, fmt: str) -> None:
    """Check, on this machine, what the search relies on (a few minutes); exit 1 if any fails."""
    from autotune import commands

    def said(check: Check) -> None:  # each as it ends: the whole takes minutes on a GPU
        click.echo(progress_line(check), err=True)

    report = commands.doctor_command(device=device, on_check=said)
    print_report(report, fmt)
    if report.failed:
        raise SystemExit(1)


_RESUME = ": the running trial was failed and re-queued; rerun to resume"


def library_logs(*, debug: bool) -> None:
    """Only autotune speaks on the user's terminal: what the libraries log without a
    handler of their own (bitsandbytes, imported through peft, warned of a missing
    optional kernel on every search) goes nowhere, and to stderr with --debug. A probe's
    libraries log into its trial's stderr.log as before."""

    root = logging.getLogger()
    if not any(getattr(h, "autotune", False) for h in root.handlers):  # once a process
        handler: logging.Handler = logging.StreamHandler() if debug else logging.NullHandler()
        handler.autotune = True  # type: ignore[attr-defined]
        root.addHandler(handler)


def run() -> None:
    """The `autotune` command: `main`, then the process ends once the atexit handlers have
    run, without the interpreter's teardown of every module it imported, which takes
    about 2 s once torch and transformers are loaded, after the work is done.

    Registered before anything else, the handler runs last (atexit runs them in reverse)."""
    atexit.register(_end_now)
    try:
        main()
    except SystemExit as exc:
        _STATUS[0] = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        raise
    except BaseException:
        _STATUS[0] = 1
        raise


_STATUS = [0]


def _end_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing more to say anyway
            stream.flush()
    os._exit(_STATUS[0])


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    library_logs(debug=debug)
    if debug:  # accepted anywhere on the line, not only before the command
        args = ["--debug", *(a for a in args if a != "--debug")]
    try:
        cli.main(args=args, prog_name="autotune", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:  # a bad option: one line, and where to read more
        command = exc.ctx.command_path if exc.ctx else "autotune"
        click.echo(f"error: {exc.format_message()} (see {command} --help)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo(f"interrupted{_RESUME if 'search' in args else ''}", err=True)
        sys.exit(130)
    except Terminated:
        click.echo(f"terminated{_RESUME}", err=True)
        sys.exit(143)
    except AutotuneError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # the machine's fault (disk full, permissions), not the code's
        if debug:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        then = "rerun the same command to resume" if "search" in args else "run it again"
        click.echo(
            f"error: {exc.strerror or exc}{where}: free disk space or fix the permissions, "
            f"then {then}",
            err=True,
        )
        sys.exit(1)
