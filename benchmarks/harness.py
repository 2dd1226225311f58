"""What every benchmark shares, once: its command line, its stamp, its records, and the
ways it measures (a search run whole, a config probed as a search probes it, a user's
training run under a memory limit, a Markdown table).

A benchmark is a script whose docstring states its question and its commands, and whose
`main` hands `run` a declaration:

    def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]: ...  # its figures
    def report(f: dict[str, Any]) -> str: ...  # its Markdown, under `header(f, title)`

    if __name__ == "__main__":
        run(Benchmark("scaleout", __doc__, measure, report, options=...))

Every benchmark takes `--quick` (its smallest setting: what the suite runs) and
`--record` (write NAME.json and add the report to RESULTS.md); without it the figures
are printed and nothing is written. Each run works in a fresh temporary folder.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}

Figures = dict[str, Any]


@dataclass(frozen=True)
class Benchmark:
    name: str  # the script's stem: its NAME.json and its records
    doc: str  # the script's docstring: the question, then how to run it
    measure: Callable[[argparse.Namespace, Path], Figures]
    report: Callable[[Figures], str]
    options: Callable[[argparse.ArgumentParser], None] = lambda parser: None


def parser(bench: Benchmark) -> argparse.ArgumentParser:
    """The benchmark's command line: its docstring as help, --quick, --record, its own."""
    summary, _, details = bench.doc.strip().partition("\n\n")
    parser = argparse.ArgumentParser(
        description=summary,
        epilog=details,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="the smallest setting (the suite's)")
    parser.add_argument(
        "--record",
        action="store_true",
        help=f"write benchmarks/{bench.name}.json and add the report to RESULTS.md",
    )
    bench.options(parser)
    return parser


def run(bench: Benchmark, argv: Sequence[str] | None = None) -> Figures:
    """Parse the benchmark's command line, measure in a fresh folder, print the figures
    and the report; with --record, keep both."""
    args = parser(bench).parse_args(argv)
    with tempfile.TemporaryDirectory(prefix=f"autotune-{bench.name}-") as tmp:
        figures = {**stamp(), "quick": args.quick, **bench.measure(args, Path(tmp))}
    markdown = bench.report(figures)
    print(json.dumps(figures, indent=2, default=str))
    print(markdown)
    if args.record:
        (HERE / f"{bench.name}.json").write_text(json.dumps(figures, indent=2, default=str) + "\n")
        with open(HERE / "RESULTS.md", "a", encoding="utf-8") as out:
            out.write(markdown)
    return figures


def stamp() -> dict[str, str]:
    """Where and when the figures were measured: date, machine, versions, commit, command."""
    import torch
    import transformers

    from autotune.system.devices import cpu_memory_bytes, cpu_name

    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "date": datetime.date.today().isoformat(),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, {cpu_memory_bytes() / 2**30:.0f} GiB",
        "versions": f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}",
        "commit": commit or "unknown",
        "command": shlex.join(["python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
    }


def header(f: Figures, title: str) -> str:
    """A record's first lines: its title and date, then where and how it was measured."""
    quick = ", quick" if f.get("quick") else ""
    return (
        f"\n## {title} ({f['date']}{quick})\n\n"
        f"Machine: {f['machine']}; {f['versions']}; at {f['commit']}. "
        f"Command: `{f['command']}`.\n"
    )


def table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --- the models the benchmarks build from configs (no hub) ---


def gpt2(**fields: Any) -> dict[str, Any]:
    """A small GPT-2 config: 128 wide, 2 layers, unless `fields` say otherwise."""
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": 128,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 256,
        "vocab_size": 4096,
        "bos_token_id": 0,
        "eos_token_id": 0,
        **fields,
    }


def model_folder(work: Path, name: str, config: dict[str, Any]) -> Path:
    """A folder holding `config` as a model autotune builds with random weights."""
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# --- a search run whole, through the CLI ---


def autotune(work: Path, *args: str, stamped: bool = False) -> subprocess.CompletedProcess[str]:
    """`autotune ARGS` in `work`, its output captured; `stamped`: each line of it
    (stderr merged into stdout) with the seconds since it started (benchmarks/stamped.py)."""
    command = [sys.executable, "-m", "autotune", *args]
    return subprocess.run(
        [sys.executable, str(HERE / "stamped.py"), *command] if stamped else command,
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
        env=ENV,
    )


@dataclass(frozen=True)
class Searched:
    """An `autotune search` that ended: its wall time and its study as `show` gives it."""

    wall_s: float
    shown: dict[str, Any]
    output: str = ""

    @property
    def trials(self) -> list[dict[str, Any]]:
        return list(self.shown["trials"])

    @property
    def best(self) -> dict[str, Any] | None:
        return next((t for t in self.trials if t.get("best")), None)

    @property
    def probes(self) -> list[dict[str, Any]]:
        """The trials that ran (skipped proposals left out)."""
        return [t for t in self.trials if t["outcome"] != "skipped"]


def search(
    work: Path, study: str, *flags: str, storage: str = "", stamped: bool = False
) -> Searched:
    """`autotune search --study STUDY FLAGS` in `work`, then its `show`; a failed search
    ends the benchmark with its error."""
    where = ("--storage", storage) if storage else ()
    started = time.monotonic()
    done = autotune(work, "search", "--study", study, *where, *flags, stamped=stamped)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"autotune search --study {study} failed:\n{done.stderr[-1500:]}")
    return Searched(round(wall, 1), show(work, study, storage), done.stdout)


def show(work: Path, study: str, storage: str = "") -> dict[str, Any]:
    where = ("--storage", storage) if storage else ()
    shown = autotune(work, "show", "--study", study, *where, "--format", "json")
    if shown.returncode != 0:
        raise SystemExit(f"autotune show --study {study} failed:\n{shown.stderr[-800:]}")
    result: dict[str, Any] = json.loads(shown.stdout)
    return result


def readme_main_job() -> list[str]:
    """The README's main job: its first `autotune search` command's flags as written
    there (its --study dropped: each benchmark names its own)."""
    line = next(
        line for line in (ROOT / "README.md").read_text().splitlines() if "autotune search" in line
    )
    words = shlex.split(line.split("autotune search", 1)[1])
    if "--study" in words:
        at = words.index("--study")
        del words[at : at + 2]
    return words


# --- a config probed as a search probes it ---


@dataclass
class Prober:
    """Probes of one model under one memory limit, as a search runs them: on the CPU
    through a fork server that built the model once. `fields`: the TrialConfig's fields
    every probe shares (seq_len, target_len, ...)."""

    model: Any  # autotune.core.trial.ModelSpec
    work: Path
    limit: int | None = None
    device: str = "cpu"
    fields: dict[str, Any] = field(default_factory=dict)
    count: int = 0

    def __post_init__(self) -> None:
        from autotune.launch.forkserver import ForkServer
        from autotune.probe.shared_model import SharedModel

        started = time.monotonic()
        shared = SharedModel(self.model, 0, {"attn_implementation": "sdpa"})
        self.server = (
            ForkServer(self.work / f"server-{self.limit}.log", data_limit=self.limit, shared=shared)
            if self.device == "cpu"
            else None
        )
        self.start_s = time.monotonic() - started

    def __call__(self, candidate: Any, warmup: int = 1, measure: int = 3, **fields: Any) -> Any:
        """The probe's TrialResult."""
        from autotune.core.trial import TrialConfig
        from autotune.launch.runner import run_trial

        self.count += 1
        config = TrialConfig(
            number=self.count,
            trial_dir=str(self.work / "probes" / str(self.count)),
            model=self.model,
            candidate=candidate,
            device=self.device,
            memory_limit_bytes=self.limit,
            warmup_steps=warmup,
            measure_steps=measure,
            **{"seq_len": 128, "target_len": 0, **self.fields, **fields},
        )
        return run_trial(config, timeout_s=600, server=self.server)

    def speed(self, candidate: Any, warmup: int = 1, measure: int = 3) -> float:
        """Samples/s within the limit (0: did not fit or failed)."""
        return score(self(candidate, warmup, measure), self.limit)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def score(result: Any, limit: int | None) -> float:
    """A probe's samples/s if it ran cleanly within the limit, else 0: as the search judges."""
    from autotune.core.trial import Outcome

    if result is None or result.outcome != Outcome.OK or result.samples_per_s is None:
        return 0.0
    fits = limit is None or (result.peak_memory_bytes or 0) <= limit
    return float(result.samples_per_s) if fits else 0.0


# --- the user's own training run, under a memory limit ---


def train(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """A real Trainer run in a child process under the spec's RLIMIT_DATA
    (benchmarks/_train_child.py says what the spec holds)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=work, delete=False) as handle:
        json.dump(spec, handle)
    out = Path(handle.name).with_suffix(".out.json")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(HERE / "_train_child.py"), handle.name, str(out)],
        capture_output=True,
        text=True,
        check=False,
        cwd=work,
        # RLIMIT_DATA stands in for the machine's memory, but it also counts address
        # space reserved and never touched, which RAM does not: pyarrow's default pool
        # reserves some at import (Trainer imports `datasets`). The probe turns that pool
        # off (autotune/system/process.py); without the same here a run of every way is
        # charged memory it never used (vs_default --quick: autotune's 8x2 and the
        # halving's batch 8 ran out of memory at 0.77 GiB resident under 900 MiB).
        env={**ENV, "ARROW_DEFAULT_MEMORY_POOL": "system"},
    )
    if not out.exists():
        killed = done.returncode < 0
        return {
            "outcome": "oom" if killed else "error",
            "wall_s": time.monotonic() - started,
            "error": done.stderr[-300:],
        }
    result: dict[str, Any] = json.loads(out.read_text())
    result["process_wall_s"] = time.monotonic() - started
    return result


# --- configs trained by the user's own Trainer, side by side (a search's pick and others) ---

# A search of the classic five dimensions only: benchmarks/levers.py measures the others
CLASSIC = ("--lever", "torch_compile=false", "--lever", "attn_implementation=sdpa")


def trainer_spec(
    model: dict[str, Any],
    task: str,
    seq_len: int,
    args: dict[str, Any],
    steps: int,
    budget_bytes: int | None,
    **fields: Any,
) -> dict[str, Any]:
    """What `train` runs: `args` (TrainingArguments fields) for `steps` optimizer steps of
    `model` on worst-case samples of `seq_len` tokens, under `budget_bytes` (None: no
    cap). `fields`: the spec's others (target_len, eval_samples, attn_implementation)."""
    batch = args["per_device_train_batch_size"] * args.get("gradient_accumulation_steps", 1)
    return {
        "model": model,
        "task": task,
        "seq_len": seq_len,
        "target_len": 0,
        "budget_bytes": budget_bytes,
        "num_samples": batch * (steps + 2),
        **fields,
        "args": {
            "output_dir": "out",
            "report_to": "none",
            "save_strategy": "no",
            "disable_tqdm": True,
            "use_cpu": True,
            **args,
            "max_steps": steps,
        },
    }


def exported(work: Path, study: str) -> dict[str, Any]:
    """The training arguments `autotune search --study STUDY` exported, as a user's script
    takes them (the output folder and the device left to the run)."""
    args: dict[str, Any] = json.loads((work / "studies" / f"{study}.best.json").read_text())
    return {k: v for k, v in args.items() if k not in ("output_dir", "use_cpu")}


def exported_with_model(work: Path, study: str) -> dict[str, Any]:
    """The export as `exported` gives it ("args"), the attention kernel its script loads
    the model with ("attention": the summary's model arguments; None: the model's
    default), and the levers the search did not offer, with why ("not_offered")."""
    summary = json.loads((work / "studies" / f"{study}.best.summary.json").read_text())
    attention = summary.get("model_arguments", {}).get("attn_implementation")
    not_offered = summary.get("levers_not_offered", {})
    return {"args": exported(work, study), "attention": attention, "not_offered": not_offered}


def side_by_side(
    work: Path,
    ways: dict[str, dict[str, Any]],
    spec: Callable[[dict[str, Any]], dict[str, Any]],
    rounds: int = 1,
    said: Callable[[dict[str, Any]], str] = lambda result: "",
) -> dict[str, list[dict[str, Any]]]:
    """Each way's training arguments trained by `train(spec(args))` once a round, in
    reverse order on odd rounds so that a drifting host favours no position: the runs'
    results, by way. Each run's speed is printed as it ends, `said(result)` after it."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ways}
    for number in range(rounds):
        for name in list(ways) if number % 2 == 0 else list(reversed(ways)):
            result = train(spec(ways[name]), work)
            runs[name].append(result)
            speed = result.get("steady_samples_per_s") or 0.0
            print(
                f"round {number + 1}, {name}: {speed:.2f} samples/s ({result['outcome']})"
                + said(result),
                flush=True,
            )
    return runs
