#!/usr/bin/env python
"""The README's GPU block, run as written on this machine: its train.py and my_args.json
copied from the README word for word, a small Llama checkpoint and its tokenizer at
`my/checkpoint` and a `train.jsonl`, then each command of the block in order, with
`--device cpu` added to the search where there is no GPU (the one substitution). Prints
each command's exit code and wall time, and what the export changed in my_args.json.

    python benchmarks/readme_as_written.py [--work DIR]

tests/test_readme.py checks the same block without running it (every command parses,
the files are what Python and SFTConfig accept); this runs it, which takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT

sys.path.insert(0, str(ROOT / "tests"))
from job_script import write_job  # a small Llama, a byte-level tokenizer, jsonl data


def gpu_block(readme: str) -> list[str]:
    """The commands of the README's GPU block after its install line, in order."""
    head = readme.split("## Tune your own training script", 1)[0]
    block = head.split('pip install torch && pip install -e ".[peft]"', 1)[1]
    lines = [line.strip() for line in block.split("\n\n", 1)[0].splitlines()]
    return [line for line in lines if line]


def prepare(work: Path, readme: str) -> None:
    """train.py and my_args.json as the README writes them; the checkpoint and data they
    name."""
    (script,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "# train.py" in b]
    (args_json,) = re.findall(r"```json\n(.*?)```", readme, re.S)
    (work / "train.py").write_text(script)
    (work / "my_args.json").write_text(args_json)
    job = work / "job"
    write_job(job)
    checkpoint = work / "my" / "checkpoint"
    shutil.copytree(job / "model", checkpoint)
    for file in (job / "tokenizer").iterdir():
        shutil.copy(file, checkpoint / file.name)
    shutil.copy(job / "train.jsonl", work / "train.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, help="a fresh folder [default: a temporary one]")
    options = parser.parse_args()
    import torch

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    work = options.work or Path(tempfile.mkdtemp(prefix="autotune-readme-"))
    work.mkdir(parents=True, exist_ok=True)
    prepare(work, readme)
    before = json.loads((work / "my_args.json").read_text())
    # `autotune` and `python` as this interpreter's environment has them
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": path}
    rows = []
    for command in gpu_block(readme):
        run = command
        if command.startswith("autotune search") and not torch.cuda.is_available():
            run += " --device cpu"
        started = time.monotonic()
        done = subprocess.run(run, shell=True, cwd=work, env=env, check=False, text=True)
        rows.append((run, done.returncode, time.monotonic() - started))
        if done.returncode != 0:
            break
    after = json.loads((work / "my_args.json").read_text())
    changed = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
    print(f"\nin {work}:")
    for run, code, seconds in rows:
        print(f"| `{run}` | exit {code} | {seconds:.0f} s |")
    print(f"my_args.json changed by the export: {changed}")
    sys.exit(max(code for _, code, _ in rows))


if __name__ == "__main__":
    main()
