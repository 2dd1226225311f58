#!/usr/bin/env python
"""Run a command and print each line of its output with the seconds since it started:
where a search's time goes (its survey, each probe, the rehearsal, confirmation, the
export), and the whole command's wall time against its --time-budget.

    python benchmarks/stamped.py autotune search --model google/mt5-small --time-budget 1m
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def main() -> int:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    started = time.monotonic()
    child = subprocess.Popen(
        sys.argv[1:],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        text=True,
    )
    assert child.stdout is not None
    for line in child.stdout:
        print(f"{time.monotonic() - started:7.1f} {line}", end="", flush=True)
    code = child.wait()
    print(f"{time.monotonic() - started:7.1f} exit {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
