"""What the benchmark scripts share: the machine line, a real training run, Markdown."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def machine() -> dict[str, str]:
    import torch
    import transformers

    from autotune.system.devices import cpu_memory_bytes, cpu_name

    return {
        "date": datetime.date.today().isoformat(),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, {cpu_memory_bytes() / 2**30:.0f} GiB",
        "versions": f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}",
    }


def train(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """A real Trainer run in a child process under the spec's RLIMIT_DATA."""
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
        env={**os.environ, "HF_HUB_OFFLINE": "1", "ARROW_DEFAULT_MEMORY_POOL": "system"},
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
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def save(name: str, figures: dict[str, Any], markdown: str, append: bool) -> None:
    print(json.dumps(figures, indent=2))
    print(markdown)
    if append:
        (HERE / f"{name}.json").write_text(json.dumps(figures, indent=2) + "\n")
        with open(HERE / "RESULTS.md", "a", encoding="utf-8") as out:
            out.write(markdown)
