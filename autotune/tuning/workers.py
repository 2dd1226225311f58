"""`--parallel N` and `--devices`: several searching processes on one study.

Each worker is `python -m autotune.worker JOB.json`, the same search loop a second
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

from autotune.core.enums import DeviceKind
from autotune.core.errors import AutotuneError, UsageError
from autotune.core.spec import SearchSpec
from autotune.store.storage import STORAGE_ENV
from autotune.system.devices import visible_entry
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits

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
    """What one worker process does. The storage URL is not in it: it travels in the
    worker's environment (AUTOTUNE_STORAGE), so no password is written to disk."""

    index: int
    slot: Slot
    spec: SearchSpec
    study_name: str
    study_dir: str
    sampler: str
    limits: SearchLimits
    explore_s: float | None  # seconds left to explore when the worker starts

    def to_json(self) -> str:
        raw = dataclasses.asdict(self)
        raw["spec"] = json.loads(self.spec.to_json())
        return json.dumps(raw, indent=2)

    @classmethod
    def from_json(cls, text: str) -> WorkerJob:
        raw = json.loads(text)
        slot = Slot(tuple(raw["slot"]["cores"]), raw["slot"]["gpu"])
        spec = SearchSpec.from_json(json.dumps(raw["spec"]))
        return cls(**{**raw, "slot": slot, "spec": spec, "limits": SearchLimits(**raw["limits"])})


def plan_slots(
    device_kind: str, parallel: int, devices: tuple[str, ...] | None, visible_gpus: int = 0
) -> list[Slot]:
    """One slot per worker: the given GPUs (indices among the `visible_gpus` this process
    sees, through any CUDA_VISIBLE_DEVICES of the user's), or the CPU's cores split evenly."""
    if devices:
        if device_kind != DeviceKind.CUDA:
            raise UsageError("--devices needs CUDA GPUs; on the CPU use --parallel N")
        bad = [d for d in devices if not d.isdigit() or int(d) >= visible_gpus]
        if bad:
            raise UsageError(
                f"--devices {','.join(devices)}: {', '.join(bad)} is not a GPU index here; "
                f"this process sees {visible_gpus} GPU(s), numbered 0 to {visible_gpus - 1}"
            )
        return [Slot(gpu=d) for d in devices]
    if device_kind != DeviceKind.CPU:
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
    study_dir: Path,
    sampler: str,
    limits: SearchLimits,
    deadline: Deadline,
) -> None:
    """Run one worker per slot on the study (which the caller has prepared) until each
    stops; then return."""
    folder = study_dir / "workers"
    folder.mkdir(parents=True, exist_ok=True)
    concurrent = len(slots) if spec.device.kind == DeviceKind.CPU else 1
    worker_limits = dataclasses.replace(
        limits, confirm_top=0, concurrent=concurrent, parity_top=limits.confirm_top
    )
    # The rest of the time budget is for the parent's parity runs and confirmation.
    explore = deadline.share(limits.search_share if limits.confirm_top else 1.0).left()
    paths, processes = [], []
    try:
        for index, slot in enumerate(slots):
            job = WorkerJob(
                index, slot, spec, study_name, str(study_dir), sampler, worker_limits, explore
            )
            path = folder / f"{index}.json"
            _write_private(path, job.to_json())
            paths.append(path)
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "autotune.worker", str(path)],
                    env={**os.environ, STORAGE_ENV: storage},
                )
            )
        for process in processes:
            process.wait()
    except BaseException:
        _stop(processes)
        raise
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
    failed = [(i, p.returncode) for i, p in enumerate(processes) if p.returncode != 0]
    if failed:
        which = ", ".join(f"worker {i} exited with {rc}" for i, rc in failed)
        raise AutotuneError(f"{which}; its messages are above; rerun the command to resume")


def _write_private(path: Path, text: str) -> None:
    """A job file only its owner reads (it names the study and its folders)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


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
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_entry(int(slot.gpu))
    if slot.cores:
        os.sched_setaffinity(0, slot.cores)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = str(len(slot.cores))
