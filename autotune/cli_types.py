"""The CLI's option types and shared options: each type parses one kind of value, and
its error is the message."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from autotune.core import checkpointing
from autotune.core.checkpointing import Checkpointing
from autotune.core.enums import Objective, Precision, SamplerName, Task, values
from autotune.core.levers import lever_help
from autotune.core.optimizers import DEFAULT as DEFAULT_OPTIMIZERS
from autotune.core.units import parse_duration, parse_size
from autotune.tuning.options import SearchOptions


class ParsedType(click.ParamType):  # type: ignore[type-arg]
    """An option value parsed by one of our parsers; its ValueError becomes the message."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self.parse = parse

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def fraction(text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not low <= value <= high:  # also refuses nan, which every comparison fails
        raise ValueError(f"{text!r} is not between {low} and {high}")
    return value


SIZE = ParsedType("SIZE", parse_size)
DURATION = ParsedType("DURATION", parse_duration)


class ListType(click.ParamType):  # type: ignore[type-arg]
    """A comma-separated list, each item checked against `choices` when given."""

    name = "LIST"

    def __init__(self, choices: tuple[str, ...] | None = None) -> None:
        self.choices = choices

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        items = tuple(dict.fromkeys(v.strip() for v in str(value).split(",") if v.strip()))
        if not items:
            self.fail("is empty; give a comma-separated list", param, ctx)
        bad = [v for v in items if self.choices and v not in self.choices]
        if bad:
            self.fail(f"{', '.join(bad)} not in {', '.join(self.choices or ())}", param, ctx)
        return items


def study_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--study and --storage, shared by the commands that read a stored study."""
    command = click.option(
        "--storage",
        help="Optuna storage URL, or a journal file's path [default: $AUTOTUNE_STORAGE, else "
        "sqlite:///studies/autotune.db].",
    )(command)
    command = click.option(
        "--study", "study_name", required=True, help="The study's name (see `autotune search`)."
    )(command)
    return command


OBJECTIVE = click.option(
    "--objective",
    default="throughput",
    show_default=True,
    type=click.Choice(values(Objective)),
    help="throughput: the fastest config that fits; efficiency: the most samples/s per "
    "GiB of peak memory (the best throughput per memory).",
)


# show, export and report: the objective the study was searched for, unless asked
STUDY_OBJECTIVE = click.option(
    "--objective",
    type=click.Choice(values(Objective)),
    help="Select by this objective instead of the one the study was searched for "
    "(throughput: the fastest that fits; efficiency: samples/s per GiB of peak).",
)


def table_or_json(
    help_text: str = "table for people, json for scripts.",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--format table|json, as every command that prints results has it."""
    return click.option(
        "--format",
        "fmt",
        default="table",
        show_default=True,
        type=click.Choice(["table", "json"]),
        help=help_text,
    )


TABLE_OR_JSON = table_or_json()

# A --model stand-in's adapter: `search` and `estimate` take it alike.
ADAPTER_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option(
        "--lora",
        metavar="SETTINGS",
        help="Wrap the --model stand-in in a LoRA adapter, e.g. r=16,alpha=32,"
        "targets=q_proj,v_proj (needs peft).",
    ),
    click.option(
        "--peft-config",
        type=click.Path(path_type=Path),
        help="The stand-in's LoRA adapter from an adapter_config.json (instead of --lora).",
    ),
]


def adapter_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(ADAPTER_OPTIONS):
        command = option(command)
    return command


# The `search` command's options, in the order `--help` lists them.
SEARCH_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option(
        "--trainer",
        metavar="FILE.py:FUNCTION",
        help="Your own job: a function that takes the training arguments and returns your "
        "Trainer (or SFTTrainer, ...); every probe trains what it builds. Also "
        "package.module:FUNCTION. Give --trainer or --model, not both.",
    ),
    click.option(
        "--model",
        help="Without a script of yours: a stand-in built from a local directory, hub id, "
        "or bundled preset, trained on synthetic or --dataset batches.",
    ),
    click.option(
        "--args-class",
        metavar="CLASS",
        help="Your factory's arguments class when its parameter is not annotated: "
        "TrainingArguments, Seq2SeqTrainingArguments, SFTConfig, or module.Class.",
    ),
    *ADAPTER_OPTIONS,
    click.option(
        "--task",
        default="auto",
        show_default=True,
        type=click.Choice(["auto", *values(Task)]),
        help="What the model is trained for (auto: from its config's architectures).",
    ),
    click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N."),
    click.option(
        "--memory-budget",
        type=SIZE,
        help="What one training process may use, e.g. 8GiB, 7500MB [default: the device's "
        "capacity].",
    ),
    click.option(
        "--headroom",
        default=0.05,
        show_default=True,
        type=ParsedType("FRACTION", lambda text: fraction(text, 0.0, 0.5)),
        help="Fraction of the budget kept free for fragmentation in long runs (0 to 0.5).",
    ),
    click.option(
        "--global-batch-size",
        type=click.IntRange(1),
        help="Kept exactly: per-device batch x accumulation steps [default: 32, or --base-args'].",
    ),
    click.option(
        "--seq-len",
        type=click.IntRange(1),
        help="Longest input you train with [default: min(512, model limit)].",
    ),
    click.option(
        "--target-len",
        type=click.IntRange(1),
        help="Longest target, seq2seq only [default: 128, or --base-args' max_target_length].",
    ),
    click.option(
        "--train-steps",
        type=click.IntRange(1),
        help="Your run's optimizer steps: select by time to finish it (one-time costs such "
        "as compilation + steps) instead of steady throughput [default: --base-args' "
        "max_steps, else throughput].",
    ),
    click.option(
        "--base-args",
        type=click.Path(path_type=Path),
        help="Your arguments JSON: global batch, sequence lengths and other fields come from it.",
    ),
    click.option(
        "--dataset",
        help="Your data: a save_to_disk folder, a .json/.jsonl/.csv/.parquet/.txt file, or a hub "
        "name. Its lengths set --seq-len; length-grouped sampling becomes a searched choice.",
    ),
    click.option(
        "--dataset-split", default="train", show_default=True, help="Split of --dataset to read."
    ),
    click.option("--text-column", help="Input text column [default: text, or the first column]."),
    click.option("--target-column", help="seq2seq target text (classification: label) column."),
    click.option("--tokenizer", help="Folder or hub id [default: the model's own]."),
    click.option(
        "--precisions",
        type=ListType(tuple(values(Precision))),
        help="Comma-separated, from fp32, tf32, fp16, bf16, as-loaded [default: all the device "
        "and your job support]. as-loaded takes the place of fp32 and tf32 where your job "
        "holds its weights in 16 bits or quantized (no autocast: each layer in its weights' "
        "dtype). Precision changes the training arithmetic: leave out what your recipe must "
        "not use.",
    ),
    click.option(
        "--optimizers",
        type=ListType(),
        help="TrainingArguments optim names [default: those installed of "
        f"{', '.join(DEFAULT_OPTIMIZERS)}; with --trainer also your own optim, and "
        "bitsandbytes' paged and 8-bit ones for a quantized base].",
    ),
    click.option(
        "--activation-checkpointing",
        "--checkpointing",
        "checkpointing",
        type=ListType(tuple(level.value for level in Checkpointing)),
        help=checkpointing.HELP,
    ),
    click.option(
        "--lever",
        "levers",
        multiple=True,
        metavar="NAME=V[,V]",
        help=lever_help(),
    ),
    click.option(
        "--max-trials",
        default=20,
        show_default=True,
        type=click.IntRange(1),
        help="Probes in the whole study; a resumed study counts earlier ones.",
    ),
    click.option(
        "--time-budget",
        type=DURATION,
        help="The whole search's time, e.g. 10m [default: 30m]: exploring stops at 80% of "
        "it (all of it with --confirm-top 0), earlier by the parity runs' expected time; "
        "confirming gets the rest (a run expected to end past it does not start). It also "
        "plans the search, said in its first lines: timed steps a probe, whether "
        "torch.compile is worth probing, and the parity runs' length.",
    ),
    click.option(
        "--trial-timeout",
        default="10m",
        show_default=True,
        type=DURATION,
        help="A probe still running after this is killed and recorded as timeout.",
    ),
    click.option(
        "--sampler",
        default="model",
        show_default=True,
        type=click.Choice(values(SamplerName)),
        help="What proposes the next config: model is autotune's own model of step time "
        "(fitted to the probes so far: it proposes the most promising config and stops the "
        "search when none can win); the others are Optuna's samplers.",
    ),
    click.option(
        "--seed",
        default=0,
        show_default=True,
        type=click.IntRange(0, 2**32 - 1),
        help="Seed of the sampler and of the probes' data and weights.",
    ),
    click.option(
        "--confirm-top",
        default=3,
        show_default=True,
        type=click.IntRange(0),
        help="Measure this many finalists again, longer, before selecting (0: no confirmation).",
    ),
    click.option(
        "--confirm-steps",
        type=click.IntRange(2),
        help="Measured steps of a confirmation run [default: 2 x --measure-steps].",
    ),
    click.option(
        "--confirm-rounds",
        type=click.IntRange(0),
        default=8,
        show_default=True,
        help="Paired rounds between the two finalists the export hinges on (timed back "
        "to back, the order alternating) while their runs cannot tell them apart: at most "
        "this many, twice as many while the rounds read the config that would displace the "
        "export ahead; the first confirmations count as one. Below 2: none.",
    ),
    click.option(
        "--parity",
        type=click.Choice(["auto", "on", "quick", "off"]),
        default="auto",
        show_default=True,
        help="Train each finalist whose precision or optimizer differs from your recipe "
        "beside it and never export one that learns differently. on: 20-step runs, which "
        "verify (exploring stops early to leave them time); quick: no runs, the probes' own "
        "losses (the same batches from the same weights), which catch NaNs and gross "
        "divergence but cannot verify, and export such unverified configs, saying so; "
        "auto: on where the time budget affords it (the search says which, after its "
        "first probes), else quick; off: skip the check, and say so.",
    ),
    click.option(
        "--parity-steps",
        type=click.IntRange(2),
        help="Optimizer steps of each parity run [default: 20; none with --parity quick; "
        "with auto, planned by the time budget]. "
        "Fewer than 20 cannot verify a config: within the tolerance it is 'unverified', "
        "exported only with --parity quick.",
    ),
    click.option(
        "--rehearse/--no-rehearse",
        default=True,
        show_default=True,
        help="Before the export, run the selected config's evaluation (your data, "
        "collator, compute_metrics and evaluation settings) and a checkpoint save and "
        "resume under the same memory budget; one that runs out of memory is not "
        "exported, and the evaluation batch is tuned to fit.",
    ),
    click.option(
        "--fork-server/--no-fork-server",
        default=True,
        show_default=True,
        help="Fork each probe from a pre-imported server (saves the import of every trial).",
    ),
    click.option(
        "--warmup-steps",
        default=3,
        show_default=True,
        type=click.IntRange(1),
        help="At most this many optimizer steps before timing (fewer once step time is "
        "steady; --fixed-steps: exactly this many).",
    ),
    click.option(
        "--measure-steps",
        type=click.IntRange(2),
        help="Optimizer steps timed per probe, at most [default: 2 under a 3m time "
        "budget, 3 under 10m, else 5]. On the CPU timing stops early once "
        "the config is clearly slower than the best so far, and where steps are fast it "
        "times about one second of them instead (up to 20); on a GPU it times at least 2 s "
        "and 20 steps; --fixed-steps: always exactly this many.",
    ),
    click.option(
        "--reuse/--no-reuse",
        default=True,
        show_default=True,
        help="Take over what another study in the storage measured of a config (same "
        "model, device, lengths, recipe and versions) instead of probing it again.",
    ),
    click.option(
        "--fixed-steps",
        is_flag=True,
        help="Time every probe for exactly --warmup-steps + --measure-steps steps.",
    ),
    click.option(
        "--study",
        "study_name",
        help="The study's name, which show, export, report and a rerun take "
        "[default: from the model's name, or your script's or module's].",
    ),
    click.option(
        "--storage",
        help="Optuna storage URL, e.g. postgresql://user@host/db to share the study between "
        "machines, or a journal file's path on a filesystem they share (e.g. "
        "/shared/studies/autotune.log) [default: $AUTOTUNE_STORAGE (kept out of `ps`), else "
        "sqlite:///studies/autotune.db]. A busy storage is retried for "
        "$AUTOTUNE_STORAGE_PATIENCE_S (60 s); a searching process records a heartbeat "
        "every $AUTOTUNE_HEARTBEAT_S (10 s), and a trial silent for three is a dead worker's.",
    ),
    click.option(
        "--parallel",
        default=1,
        show_default=True,
        type=click.IntRange(1),
        help="CPU: run this many trials at a time, the cores split between them.",
    ),
    click.option(
        "--devices",
        type=ListType(),
        help="CUDA: run one trial at a time on each of these GPUs, e.g. 0,1,2,3.",
    ),
    click.option(
        "--nproc-per-node",
        default=1,
        show_default=True,
        type=click.IntRange(1),
        help="Probe each config as a DDP run of N processes (torchrun; gloo on the CPU); "
        "global batch = per-device batch x accumulation x N.",
    ),
    click.option(
        "--nnodes",
        default=1,
        show_default=True,
        type=click.IntRange(1),
        help="Probe each config across this many nodes, --nproc-per-node processes on each "
        "(torchrun's c10d rendezvous): run the same command on every node with its own "
        "--node-rank, sharing --storage; global batch = ... x N x nodes.",
    ),
    click.option(
        "--node-rank",
        type=click.IntRange(0),
        help="This node's rank with --nnodes: 0 on the head, which searches and exports; "
        "the others follow it [default: $SLURM_NODEID under srun].",
    ),
    click.option(
        "--rdzv-endpoint",
        help="The head's address every node reaches (HOST, or HOST:PORT as torchrun's; each "
        "probe takes a fresh port there) [default: Slurm's first node under srun].",
    ),
    click.option(
        "--output",
        type=click.Path(path_type=Path),
        help="Where to write the tuned arguments JSON [default: studies/<study>.best.json; "
        "with another --storage than the default, studies/<study>-<storage key>.best.json].",
    ),
    OBJECTIVE,
    click.option(
        "--quiet",
        is_flag=True,
        help="Print one plain line per event instead of the live table (for logs and CI).",
    ),
    table_or_json("json: the result as JSON on stdout, the progress lines on stderr."),
    click.option(
        "--force",
        is_flag=True,
        help="Replace --output even if autotune did not write it (never a database).",
    ),
]


def search_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(SEARCH_OPTIONS):
        command = option(command)
    return command


# `search --help`'s headings: each starts at its field of SearchOptions and holds the
# fields declared after it, so an option added among them needs no edit here
HEADINGS = {
    "trainer": "Common",
    "args_class": "Advanced: your job",
    "dataset": "Advanced: your data",
    "precisions": "Advanced: what to try",
    "max_trials": "Advanced: how to search",
    "global_batch_size": "Advanced: the workload",
    "storage": "Advanced: storage and workers",
    "quiet": "Advanced: output",
}


def search_groups() -> dict[str, list[str]]:
    """The options under each heading of `search --help`, in SearchOptions' order (the
    output group also holds --format and --help, which only the CLI has)."""
    groups: dict[str, list[str]] = {}
    heading = ""
    for field in dataclasses.fields(SearchOptions):
        heading = HEADINGS.get(field.name, heading)
        groups.setdefault(heading, []).append(field.name)
    groups[HEADINGS["quiet"]] += ["fmt", "help"]
    return groups


class GroupedCommand(click.Command):
    """A command whose --help lists its options under headings (search_groups)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        help_option = self.get_help_option(ctx)
        records = {
            "help" if p is help_option else p.name: p.get_help_record(ctx)
            for p in self.get_params(ctx)
        }
        placed: set[str | None] = set()
        for title, names in search_groups().items():
            rows = [r for n in names if (r := records.get(n)) is not None]
            placed.update(names)
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
        rest = [r for n, r in records.items() if n not in placed and r is not None]
        if rest:
            with formatter.section("Other options"):
                formatter.write_dl(rest)
