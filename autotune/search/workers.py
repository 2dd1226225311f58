"""`--parallel N` and `--devices`: several searching processes on one study.

Each worker is `python -m autotune.workers JOB.json`, the same search loop a second
machine runs against a shared storage, confined to its share of this machine: CPU
cores (affinity and thread count) or one GPU (CUDA_VISIBLE_DEVICES). Workers only
explore; the parent then confirms the finalists alone, so the figures it selects on
are comparable, and exports.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from autotune.core.errors import AutotuneError, Terminated, UsageError, raise_terminated
from autotune.search.run import SearchLimits, prepare_study, run_search
from autotune.core.spec import SearchSpec

STOP_GRACE_S = 60.0  # a worker told to stop fails and re-queues its trial in this time


@dataclasses.dataclass(frozen=True)
class Slot:
    """A worker's share of the machine."""

    cores: tuple[int, ...] = ()  # CPU: the cores its probes run on
    gpu: str = ""  # CUDA: the one device its probes see

    def describe(self) -> str:
        return f"GPU {self.gpu}" if self.gpu else f"cores {','.join(map(str, self.cores))}"


@dataclasses.dataclass(frozen=True)
class WorkerJob:
    index: int
    slot: Slot
    spec: str  # SearchSpec JSON
    study_name: str
    storage: str
    studies_dir: str
    sampler: str
    limits: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> WorkerJob:
        raw = json.loads(text)
        slot = Slot(tuple(raw["slot"]["cores"]), raw["slot"]["gpu"])
        return cls(**{**raw, "slot": slot})


def plan_slots(device_kind: str, parallel: int, devices: tuple[str, ...] | None) -> list[Slot]:
    """One slot per worker: the given GPUs, or the CPU's cores split evenly."""
    if devices:
        if device_kind != "cuda":
            raise UsageError("--devices needs CUDA GPUs; on the CPU use --parallel N")
        return [Slot(gpu=d) for d in devices]
    if device_kind != "cpu":
        raise UsageError("on GPUs give --devices 0,1,... (one trial per GPU) instead of --parallel")
    cores = sorted(os.sched_getaffinity(0))
    if parallel > len(cores):
        raise UsageError(
            f"--parallel {parallel} needs at least {parallel} cores; this process may use "
            f"{len(cores)}"
        )
    share = len(cores) // parallel
    return [Slot(cores=tuple(cores[i * share : (i + 1) * share])) for i in range(parallel)]


def run_workers(
    *,
    spec: SearchSpec,
    slots: list[Slot],
    study_name: str,
    storage: str,
    studies_dir: Path,
    sampler: str,
    limits: SearchLimits,
) -> None:
    """Run one worker per slot on the study until each stops; then return."""
    prepare_study(spec=spec, study_name=study_name, storage=storage, sampler=sampler)
    folder = studies_dir / study_name / "workers"
    folder.mkdir(parents=True, exist_ok=True)
    concurrent = len(slots) if spec.device.kind == "cpu" else 1
    budget = limits.time_budget_s
    if budget is not None and limits.confirm_top:
        budget *= limits.search_share  # the rest is for the parent's confirmation
    worker_limits = dataclasses.replace(
        limits, conclude=False, confirm_top=0, concurrent=concurrent, time_budget_s=budget
    )
    processes = []
    for index, slot in enumerate(slots):
        job = WorkerJob(
            index,
            slot,
            spec.to_json(),
            study_name,
            storage,
            str(studies_dir),
            sampler,
            dataclasses.asdict(worker_limits),
        )
        path = folder / f"{index}.json"
        path.write_text(job.to_json(), encoding="utf-8")
        processes.append(subprocess.Popen([sys.executable, "-m", "autotune.search.workers", str(path)]))
    try:
        for process in processes:
            process.wait()
    except BaseException:
        _stop(processes)
        raise
    failed = [(i, p.returncode) for i, p in enumerate(processes) if p.returncode != 0]
    if failed:
        which = ", ".join(f"worker {i} exited with {rc}" for i, rc in failed)
        raise AutotuneError(f"{which}; its messages are above; rerun the command to resume")


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """Ask each worker to stop (it fails and re-queues its trial), then make sure."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def confine(slot: Slot) -> None:
    """Restrict this process (and the probes it starts) to the slot."""
    if slot.gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = slot.gpu
    if slot.cores:
        os.sched_setaffinity(0, slot.cores)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = str(len(slot.cores))


def main(argv: list[str] | None = None) -> int:
    from autotune.views.progress import Progress

    argv = sys.argv[1:] if argv is None else argv
    job = WorkerJob.from_json(Path(argv[0]).read_text(encoding="utf-8"))
    signal.signal(signal.SIGTERM, raise_terminated)
    confine(job.slot)
    spec = SearchSpec.from_json(job.spec)
    if job.slot.gpu:  # the one visible GPU is cuda:0 in this process
        spec = dataclasses.replace(spec, device=dataclasses.replace(spec.device, index=0))
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"worker {job.index}: {job.slot.describe()}")
    try:
        run_search(
            spec=spec,
            study_name=job.study_name,
            storage=job.storage,
            studies_dir=Path(job.studies_dir),
            limits=SearchLimits(**job.limits),
            sampler=job.sampler,
            output=Path(os.devnull),
            objective="throughput",
            observer=Progress(console, live=False),
        )
    except KeyboardInterrupt:
        return 130
    except Terminated:
        return 143
    except AutotuneError as exc:
        print(f"worker {job.index}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
