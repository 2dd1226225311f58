"""One searching worker of `--parallel N` or `--devices`: `python -m autotune.worker
JOB.json` explores the study on its share of the machine (tuning/workers.py starts it),
printing plain progress lines."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from pathlib import Path

from rich.console import Console

from autotune.core.errors import AutotuneError, Terminated, raise_terminated
from autotune.store.storage import STORAGE_ENV
from autotune.tuning.deadline import Deadline
from autotune.tuning.run import prepare_store, run_search
from autotune.tuning.workers import WorkerJob, confine
from autotune.views.progress import Progress


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job = WorkerJob.from_json(Path(argv[0]).read_text(encoding="utf-8"))
    signal.signal(signal.SIGTERM, raise_terminated)
    confine(job.slot)
    spec = job.spec
    if job.slot.gpu:  # the one visible GPU is cuda:0 in this process
        spec = dataclasses.replace(spec, device=dataclasses.replace(spec.device, index=0))
    console = Console(highlight=False, soft_wrap=True, markup=False)
    console.print(f"worker {job.index}: {job.slot.describe()}")
    try:
        store = prepare_store(
            spec=spec,
            study_name=job.study_name,
            storage=os.environ[STORAGE_ENV],
            sampler=job.sampler,
        )
        run_search(
            store=store,
            study_dir=Path(job.study_dir),
            limits=job.limits,
            deadline=Deadline.after(job.explore_s),
            observer=Progress(console, live=False),
            confirm=False,
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
