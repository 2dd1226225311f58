from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_fork import run_cli

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist the workers' probes train at the same time: each process gets
    its share of the cores as OpenMP threads (set before torch is imported; the probes
    inherit it). Two threads a process with two processes on two cores left each op's
    threads waiting for a sibling that was not scheduled: steps ran ten times slower."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = max(1, len(os.sched_getaffinity(0)) // workers)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, str(share))


_share_the_cores_between_workers()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker for each core this process may run on (xdist's own count is
    psutil's, the host's cores, more than a container or a taskset allows)."""
    return len(os.sched_getaffinity(0))


TINY_GPT2 = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 256,
    "vocab_size": 512,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
TINY_T5 = {
    "model_type": "t5",
    "architectures": ["T5ForConditionalGeneration"],
    "d_model": 64,
    "d_ff": 128,
    "d_kv": 16,
    "num_layers": 2,
    "num_heads": 4,
    "vocab_size": 512,
    "decoder_start_token_id": 0,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "is_encoder_decoder": True,
}


def write_model(directory: Path, config: dict[str, object]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture
def tiny_gpt2(tmp_path: Path) -> Path:
    return write_model(tmp_path / "tiny-gpt2", TINY_GPT2)


@pytest.fixture
def tiny_t5(tmp_path: Path) -> Path:
    return write_model(tmp_path / "tiny-t5", TINY_T5)


# Session fixtures built once and then read (and, by the resume tests, searched again) by
# many tests: under pytest-xdist (`-n auto`) their tests run on one worker, in order, so
# the study is built once and no two tests touch it at the same time.
ONE_WORKER_FIXTURES = ("tiny_budgets", "searched_study")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `cuda` skip cleanly, and say why, on a machine without a GPU.

    The tests of the shared study form one xdist group (`--dist loadgroup`); the longest
    work is handed out first (that group, then the slow tests) and the quick tests fill
    in at the end, so no worker is left with a long test while the others idle."""
    import torch

    shared, slow, quick = [], [], []
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in ONE_WORKER_FIXTURES):
            item.add_marker(pytest.mark.xdist_group("tiny_study"))
            shared.append(item)
        else:
            (slow if "slow" in item.keywords else quick).append(item)
    items[:] = shared + slow + quick
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
HEADROOM = 0.05  # the search's default


def built_on_one_worker(factory: pytest.TempPathFactory, name: str) -> None:
    """Under pytest-xdist, fail where a second worker builds this session fixture: the
    group that keeps its tests on one worker is not in force, and two workers would run
    their tests on the same study at once."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    marker = factory.getbasetemp().parent / f"{name}.built"  # shared by the workers
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        pytest.fail(
            f"{name} built on {marker.read_text()} and again on {worker}: xdist's --dist "
            "loadgroup did not keep its tests on one worker (see pytest's bound in "
            "pyproject.toml)"
        )
    os.write(fd, worker.encode())
    os.close(fd)


@dataclasses.dataclass(frozen=True)
class TinyBudgets:
    """Budgets for the tiny GPT-2 at 256 tokens, derived from peaks measured on this
    machine (what RLIMIT_DATA counts grows with cores and library versions, so no test
    hard-codes where the limit falls)."""

    peaks: dict[tuple[int, str], int]  # (batch, precision) -> peak bytes, no limit
    # what a probe process holds after its imports, before training (batch 1's run):
    # the data segment RLIMIT_DATA counts, and the resident set the peak counts
    held_after_imports: int
    resident_after_imports: int

    @property
    def eight_fits_thirty_two_does_not(self) -> int:
        """A budget whose fit limit lies midway between where batch 8 fits and where
        batch 32 runs out of memory. A config fits when its peak resident set is within
        the limit; it runs out when its data segment, which RLIMIT_DATA counts, reaches
        it, and that runs below the resident set by what the library pages add (the gap
        after the imports: 35 MiB in one process here, 73 MiB beside an xdist worker,
        175 MiB in CI's fresh environment). A config whose resident peak lies within
        that gap over the limit finishes over it instead of running out: batch 16 may.
        Batches one step apart (96 MiB here) left no room for a certain boundary."""
        eight = max(v for (b, _), v in self.peaks.items() if b == 8)
        thirty_two = min(v for (b, _), v in self.peaks.items() if b == 32)
        gap = max(0, self.resident_after_imports - self.held_after_imports)
        held = thirty_two - gap
        assert held - eight > 60 * MIB, f"no room between batch 8 and 32: {self}"
        return int((eight + held) / 2 / (1 - HEADROOM))

    @property
    def nothing_fits(self) -> int:
        """A budget whose limit lies above what a probe holds after its imports, by half of
        what batch 1's training adds to it: every probe starts, and runs out of memory
        training. Derived from both, since the imports' share grows with the libraries'
        releases (transformers 5.24 holds more than 0.85 of batch 1's peak)."""
        grown = self.peaks[(1, "fp32")] - self.resident_after_imports
        assert grown > 20 * MIB, f"batch 1 adds {grown / MIB:.0f} MiB to the imports"
        return int((self.held_after_imports + grown / 2) / (1 - HEADROOM))

    @property
    def below_imports(self) -> int:
        """A budget whose limit is below what a probe holds after its imports alone."""
        return int(0.8 * self.held_after_imports / (1 - HEADROOM))


@pytest.fixture(scope="session")
def tiny_budgets(tmp_path_factory: pytest.TempPathFactory) -> TinyBudgets:
    """Peaks measured as a search's probes run: forked from a server that built the model
    once. A fresh interpreter holds other pages (its own imports, its own copy of the
    model), and budgets derived from its peaks missed the search's boundary by as much
    as the gap between two batches on a CI host."""
    from autotune.core.enums import DeviceKind
    from autotune.core.trial import Candidate, TrialConfig
    from autotune.hf.models import resolve_model
    from autotune.launch.runner import Launcher
    from autotune.probe.shared_model import SharedModel

    built_on_one_worker(tmp_path_factory, "tiny_budgets")
    work = tmp_path_factory.mktemp("peaks")
    model = resolve_model(str(write_model(work / "tiny", TINY_GPT2)))
    peaks, after_imports = {}, {}
    sdpa = {"attn_implementation": "sdpa"}  # as the searches here fix it (PLAIN_LEVERS)
    first = Candidate(1, 16, "fp32", False, "adamw_torch", **sdpa)
    launcher = Launcher(
        DeviceKind.CPU,
        work / "forkserver.log",
        shared=SharedModel(model, 0, first.model_arguments()),
    )
    try:
        measured = ((1, "fp32"), (8, "fp32"), (8, "bf16"), (32, "fp32"), (32, "bf16"))
        for batch, precision in measured:
            config = TrialConfig(
                number=batch,
                trial_dir=str(work / f"{batch}-{precision}"),
                model=model,
                # a global batch of 16 (32 for batch 32): the peak is one micro-batch's;
                # more accumulation steps would only take longer
                candidate=Candidate(
                    batch, max(1, 16 // batch), precision, False, "adamw_torch", **sdpa
                ),
                device="cpu",
                seq_len=256,
                target_len=8,
                memory_limit_bytes=None,
                warmup_steps=2,
                measure_steps=3,
            )
            result = launcher.run(config, timeout_s=300)
            assert result.peak_memory_bytes, result
            peaks[(batch, precision)] = result.peak_memory_bytes
            after_imports.setdefault("held", result.baseline["vmdata_bytes"])
            after_imports.setdefault("resident", result.baseline["rss_bytes"])
    finally:
        launcher.close()
    return TinyBudgets(peaks, after_imports["held"], after_imports["resident"])


# Compilation (a cold compile is 25 s per tiny probe here) and the attention kernels kept
# plain in the searches whose tests are about something else: their spaces stay the size
# the tests count on. tests/tuning/test_levers_search.py searches the levers.
PLAIN_LEVERS = (
    "--lever",
    "torch_compile=false",
    "--lever",
    "attn_implementation=sdpa",
    "--lever",
    "zero_stage=0",
)


def worker_search_args(max_trials: int) -> list[str]:
    """A small search on ./tiny (8 configs) for the tests that run several workers. These
    test coordination, and some share one PostgreSQL server: --no-reuse keeps one test's
    study from taking over what another's measured. No parity runs (the recipe and the
    winner trained again, side by side), no rehearsal and no paired rounds: each has
    tests of its own (tests/tuning/test_parity_search.py, test_rehearsal.py,
    test_stop_rules.py)."""
    return [
        "search",
        "--model",
        "./tiny",
        "--device",
        "cpu",
        "--no-reuse",
        "--no-rehearse",
        "--confirm-rounds",
        "0",
        *PLAIN_LEVERS,
        "--global-batch-size",
        "16",
        "--seq-len",
        "64",
        "--precisions",
        "fp32,bf16",
        "--optimizers",
        "adamw_torch,adafactor",
        "--checkpointing",
        "off",
        "--max-trials",
        str(max_trials),
        "--warmup-steps",
        "1",
        "--measure-steps",
        "2",
        "--confirm-top",
        "1",
        "--parity",
        "off",
        "--quiet",
    ]


def probe_trials(trials: list[Any]) -> list[Any]:
    """A study's probes: finished trials with a result, not confirmations, not skipped."""
    return [
        t
        for t in trials
        if "result" in t.user_attrs
        and "confirms" not in t.user_attrs
        and t.user_attrs["outcome"] != "skipped"
    ]


def running_trial_of(study: Any, pid: int) -> Any:
    """The running trial the worker of this pid has claimed (its probe is under way)."""
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if trial.user_attrs.get("pid") == pid and "claim" in trial.user_attrs:
            return trial
    return None


def probes_running(work: Path, *, trials_only: bool = False) -> list[int]:
    """PIDs of probe children (or fork servers) working in this test's directory.

    A trial's child leads its own session; with `trials_only` the server is left out.
    """
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cwd = os.readlink(proc / "cwd")
        except (OSError, IndexError):
            continue
        state, session = stat[0], int(stat[3])
        ours = "autotune.probe" in cmdline or "autotune.launch.forkserver" in cmdline
        if trials_only and session != int(proc.name):
            continue
        if ours and cwd == str(work) and state not in "ZX":
            found.append(int(proc.name))
    return found


# A search whose test is about something else leaves out the phases with tests of their
# own (the rehearsal: tests/tuning/test_rehearsal.py; paired rounds:
# tests/tuning/test_stop_rules.py) unless it names them, as it names --parity or
# --confirm-top: `autotune` below.


def autotune(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, in a process of its own, offline (forked from an interpreter that has
    imported what it imports: tests/cli_fork.py). A search runs no rehearsal and no
    paired rounds unless its arguments ask for them."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    argv = list(args)
    if argv[:1] == ["search"] and "--help" not in argv:
        if not {"--rehearse", "--no-rehearse"} & set(argv):
            argv.append("--no-rehearse")
        if "--confirm-rounds" not in argv:
            argv += ["--confirm-rounds", "0"]
    return run_cli(argv, cwd=cwd, env=env, timeout=900)


@pytest.fixture(scope="session")
def searched_study(
    tmp_path_factory: pytest.TempPathFactory, tiny_budgets: TinyBudgets
) -> tuple[Path, list[str], str]:
    """One real search on a tiny model under a budget whose fit limit lies between batch
    8's peak and batch 32's: batch 8 fits; batch 16 fits or finishes over the limit
    (RLIMIT_DATA counts the data segment, not the resident set), which selection leaves
    out; batch 32 runs out of memory. Shared by the tests that review, export and resume
    it.

    Optuna's random sampler proposes every open config: the default model sampler stops
    once the memory estimate, fitted to the first peaks, says no untried config both fits
    and can win, so the batches over the budget may never run, where these tests need
    their real out-of-memory records."""
    built_on_one_worker(tmp_path_factory, "searched_study")
    work = tmp_path_factory.mktemp("search")
    write_model(work / "tiny", TINY_GPT2)
    argv = [
        "search",
        "--model",
        "./tiny",
        "--device",
        "cpu",
        *PLAIN_LEVERS,
        "--memory-budget",
        f"{tiny_budgets.eight_fits_thirty_two_does_not}B",
        "--global-batch-size",
        "32",
        "--seq-len",
        "256",
        "--precisions",
        "fp32,bf16",
        "--optimizers",
        "adamw_torch",
        "--checkpointing",
        "off",
        "--max-trials",
        "6",
        "--sampler",
        "random",
        "--warmup-steps",
        "2",
        "--measure-steps",
        "3",
        # parity from the probes' own losses (the 20-step runs have their own tests)
        "--parity",
        "quick",
        "--quiet",
    ]
    done = autotune(work, *argv)
    assert done.returncode == 0, done.stdout + done.stderr
    outcomes = {
        json.loads(result.read_text()).get("outcome")
        for result in (work / "studies" / "tiny" / "trials").glob("*/result.json")
    }
    # what the tests sharing it need; otherwise the budget missed the boundary: say where
    assert {"ok", "oom"} <= outcomes, f"outcomes {outcomes} under {tiny_budgets}"
    return work, argv, done.stdout


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real PostgreSQL server: the one .ci/run started (AUTOTUNE_TEST_POSTGRES), else one
    started here with .ci/postgres; the tests that need it skip, saying why, without."""
    url = os.environ.get("AUTOTUNE_TEST_POSTGRES")
    if url:
        yield url
        return
    folder = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    started = subprocess.run(
        ["bash", str(ROOT / ".ci" / "postgres"), str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if started.returncode != 0:
        pytest.skip(f"no PostgreSQL server could be started: {started.stderr.strip()[:200]}")
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run(
            ["bash", str(ROOT / ".ci" / "postgres"), "--stop", str(folder)],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(folder, ignore_errors=True)
