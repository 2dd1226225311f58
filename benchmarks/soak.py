#!/usr/bin/env python
"""Searches back to back for a set time: does anything leak?

A user on a shared box runs searches for days. Each starts a fork server, probe children,
temporary folders and SQLite connections; a leak of any of them shows only after many.
This runs real `autotune search` commands in a loop, on the CPU, in one folder and one
study file, picking each time one of:

- stand-in: a tiny GPT-2 stand-in, a short search to its end;
- factory: the user's own LoRA SFTTrainer job (`--trainer`), a short search;
- resume: the same stand-in study searched again (a rerun resumes it);
- ctrl-c: a search sent SIGINT at a random moment, as a terminal's Ctrl-C;
- sigkill: a search's own process SIGKILLed at a random moment;
- storage-busy: a search while another process holds the study file's write lock for a
  few seconds (the search waits for it and goes on).

After each it records what is left (`Soak.counts`): processes still alive, open
descriptors, memory, /dev/shm, temporary entries, the study file's bytes per probe. It
fails, naming the count, when a search left a process behind, or when a count ends above
its value after the first round of every kind (the baseline).

    python benchmarks/soak.py --minutes 60 --record   # the hour RESULTS.md records
    python benchmarks/soak.py --minutes 2 --light     # the smallest: a round of each kind
    python benchmarks/soak.py --quick                 # the same

`--light`: searches of two probes, no confirmation or parity runs (a round: 2 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from _user_job import BASE_ARGS, write_job  # the suite's LoRA SFTTrainer job
from harness import Benchmark, Figures, gpt2, header, model_folder, run, table

KINDS = ("stand-in", "factory", "resume", "ctrl-c", "sigkill", "storage-busy")
MARK = "AUTOTUNE_SOAK"  # in every child's environment: what is still alive is ours
SHORT = [
    *("--device", "cpu", "--memory-budget", "4GiB", "--lever", "torch_compile=false"),
    *("--warmup-steps", "1", "--measure-steps", "2", "--time-budget", "1m", "--quiet"),
]
FULL = ["--max-trials", "3"]
LIGHT = ["--max-trials", "2", "--confirm-rounds", "0", "--parity", "quick"]


class Soak:
    def __init__(self, work: Path, seed: int, light: bool = False) -> None:
        self.work = work
        self.light = light
        self.rng = random.Random(seed)
        self.token = f"{os.getpid()}-{seed}"
        self.tmp = work / "tmp"  # the searches' TMPDIR
        self.tmp.mkdir()
        self.db = work / "studies" / "autotune.db"
        write_job(work / "job")
        (work / "job" / "base.json").write_text(json.dumps(BASE_ARGS))
        model_folder(work, "tiny", gpt2(n_embd=64, vocab_size=512))
        self.env = {**os.environ, MARK: self.token, "TMPDIR": str(self.tmp), "HF_HUB_OFFLINE": "1"}
        self.count = 0
        self.probes = 0  # what the searches said they ran, to weigh the study file by

    # ---- the searches ---------------------------------------------------------------

    def command(self, kind: str) -> list[str]:
        self.count += 1
        storage = f"sqlite:///{self.db}"
        if kind == "factory":
            job = ["--trainer", "job/job.py:make_trainer", "--base-args", "job/base.json"]
            study = f"soak-factory-{self.count}"
        else:
            job = ["--model", "./tiny", "--global-batch-size", "8", "--seq-len", "32"]
            study = "soak-resume" if kind == "resume" else f"soak-{kind}-{self.count}"
        search = [sys.executable, "-m", "autotune", "search", *job, *SHORT]
        return [*search, *(LIGHT if self.light else FULL), "--study", study, "--storage", storage]

    def search(self, kind: str) -> dict[str, object]:
        """One search of `kind`; what it did and what it left."""
        before_bytes = self.db.stat().st_size if self.db.exists() else 0
        started = time.monotonic()
        child = subprocess.Popen(
            self.command(kind),
            cwd=self.work,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, as a terminal's job
        )
        try:
            with self.disturbed(kind, child):
                output, _ = child.communicate(timeout=900)
        except BaseException:  # the soak stopped (Ctrl-C, SIGTERM): its search with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            raise
        # a SIGKILLed search's probes die with it "within a second"
        left = self.alive(settle_s=3.0 if kind == "sigkill" else 1.0)
        said = re.search(r"(\d+) probe\(s\) this run", output or "")
        self.probes += int(said.group(1)) if said else 0
        run = {
            "kind": kind,
            "exit": child.returncode,
            "wall_s": round(time.monotonic() - started, 1),
            "left_processes": left,
            "probes": int(said.group(1)) if said else None,
            "study_growth_bytes": (self.db.stat().st_size if self.db.exists() else 0)
            - before_bytes,
            **self.counts(),
        }
        expected = {"ctrl-c": (130, 0), "sigkill": (-signal.SIGKILL, 0)}.get(kind, (0,))
        if child.returncode not in expected:
            run["error"] = (output or "").strip().splitlines()[-1:] or ["(no output)"]
        return run

    @contextlib.contextmanager
    def disturbed(self, kind: str, child: subprocess.Popen[str]) -> Iterator[None]:
        """While the search runs: its interruption, or the study file locked a while."""
        stop = threading.Event()

        def interrupt() -> None:
            if stop.wait(self.rng.uniform(3.0, 25.0)):
                return  # it ended first
            if kind == "ctrl-c":
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGINT)
            elif kind == "sigkill":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
            elif kind == "storage-busy" and self.db.exists():
                hold_lock(self.db, self.rng.uniform(3.0, 15.0), stop)

        thread = threading.Thread(target=interrupt, daemon=True)
        if kind in ("ctrl-c", "sigkill", "storage-busy"):
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread.is_alive():
                thread.join()

    # ---- what is left ---------------------------------------------------------------

    def alive(self, settle_s: float) -> list[str]:
        """Processes of the soak's searches still alive (their marker), after `settle_s`;
        each is named, then killed so the next search starts clean."""
        deadline = time.monotonic() + settle_s
        while True:
            found = marked(self.token)
            if not found or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return [f"{pid} {found[pid]}" for pid in found]

    def counts(self) -> dict[str, int]:
        study = self.db.stat().st_size if self.db.exists() else 0
        return {
            "fds": len(os.listdir("/proc/self/fd")),
            "rss_kib": rss_kib(),
            "shm": shared_memory(),
            "tmp_entries": len(os.listdir(self.tmp)),
            "study_bytes": study,
            # a study grows with what is measured, never with how often it is resumed
            "study_bytes_per_probe": study // max(self.probes, 1),
        }


def hold_lock(db: Path, seconds: float, stop: threading.Event) -> None:
    """Another process's write lock on the study file, as a second program holding it."""
    script = (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE')\n"
        "time.sleep(float(sys.argv[2]))\n"
        "c.execute('ROLLBACK')\n"
    )
    with contextlib.suppress(sqlite3.Error, subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", script, str(db), str(seconds)], timeout=120)


def marked(token: str) -> dict[int, str]:
    """Live processes whose environment carries the soak's marker: pid -> command."""
    found = {}
    needle = f"{MARK}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            if needle not in environ.split(b"\0"):
                continue
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().split(") ", 1)[1][:1]
        except OSError:
            continue  # gone, or not ours to read
        if state != "Z":  # a zombie holds nothing; its parent reaps it
            found[int(entry)] = cmdline.decode(errors="replace").strip()[:160]
    return found


def shared_memory() -> int:
    """Entries in /dev/shm of this user's (a PostgreSQL server's segments are its own)."""
    if not os.path.isdir("/dev/shm"):
        return 0
    return sum(1 for e in os.scandir("/dev/shm") if e.stat().st_uid == os.getuid())


def rss_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:", 1)[1].split()[0])


GROWING = ("fds", "rss_kib", "shm", "tmp_entries", "study_bytes_per_probe")


def slack(key: str, base: int) -> int:
    """How far above its baseline a count may end without a leak: the soak's allocator
    settling (20 MiB), and the study file's pages (4 KiB each, half again per probe)."""
    return {"rss_kib": 20 * 1024, "study_bytes_per_probe": base // 2}.get(key, 0)


def verdict(runs: list[dict[str, object]]) -> list[str]:
    """What leaked: processes a search left, counts above the baseline (their values
    after the first round of every kind): descriptors, memory, shared memory, temporary
    entries, the study file's bytes per probe."""
    problems = []
    for i, r in enumerate(runs):
        if r["left_processes"]:
            problems.append(f"search {i} ({r['kind']}) left {r['left_processes']}")
        if "error" in r:
            problems.append(f"search {i} ({r['kind']}) exited {r['exit']}: {r['error']}")
    seen: set[object] = set()
    baseline_at = len(runs) - 1
    for i, r in enumerate(runs):
        seen.add(r["kind"])
        if len(seen) == len(KINDS):
            baseline_at = i
            break
    base, last = runs[baseline_at], runs[-1]
    for key in GROWING:
        if int(last[key]) > int(base[key]) + slack(key, int(base[key])):  # type: ignore[call-overload]
            problems.append(
                f"{key} grew: {base[key]} after search {baseline_at}, {last[key]} at the end"
            )
    return problems


def measure(args: argparse.Namespace, work: Path) -> Figures:
    work = args.work or work
    work.mkdir(parents=True, exist_ok=True)
    minutes = args.minutes or (2.0 if args.quick else 60.0)
    soak = Soak(work, args.seed, args.light or args.quick)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped: clean up too
    # Started in the background (`&` in a script), the soak inherits SIGINT ignored, and
    # its searches would too: a Ctrl-C could not reach them. A handler is reset by exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    before = soak.counts()
    runs: list[dict[str, object]] = []
    end = time.monotonic() + minutes * 60
    order = list(KINDS)  # every kind once first (the baseline), then at random
    try:
        while time.monotonic() < end or len(runs) < len(KINDS):
            kind = order.pop(0) if order else soak.rng.choice(KINDS)
            runs.append(soak.search(kind))
            print(json.dumps(runs[-1]), flush=True)
    finally:
        soak.alive(settle_s=0.0)
    baseline = runs[min(len(runs), len(KINDS)) - 1]
    return {
        "minutes": minutes,
        "searches": len(runs),
        "by_kind": {k: sum(r["kind"] == k for r in runs) for k in KINDS},
        "before": before,
        "baseline": {k: v for k, v in baseline.items() if k in before},
        "after": {k: v for k, v in runs[-1].items() if k in before},
        "problems": verdict(runs),
    }


def report(f: Figures) -> str:
    kinds = ", ".join(f"{k} {n}" for k, n in f["by_kind"].items())
    rows = [(k, f["before"][k], f["baseline"].get(k), f["after"].get(k)) for k in f["before"]]
    columns = ("count", "before", "after the first round of each kind", "at the end")
    return (
        header(f, f"Soak ({f['minutes']:g} minutes)")
        + f"\n{f['searches']} searches back to back ({kinds}).\n\n"
        + table(columns, rows)
        + f"\nProblems: {'; '.join(f['problems']) or 'none'}.\n"
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, help="how long [default: 60; --quick: 2]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, help="a folder to keep [default: a temporary one]")
    parser.add_argument("--light", action="store_true", help="searches of two probes")


if __name__ == "__main__":
    if problems := run(Benchmark("soak", __doc__, measure, report, options))["problems"]:
        sys.exit("\n".join(["leaked:", *problems]))
