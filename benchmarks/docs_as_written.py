#!/usr/bin/env python
"""Every command block of the README and of examples/README.md, run as written on this
machine, in order, each document in a fresh folder. Prints each command's exit code and
wall time, and what the README's export changed in its args.json.

The only changes made to what is written:
- README, CPU try-out: the command after its install line (already done here), then in
  that folder the "Review a study" block (`dashboard` stopped after 15 s, run when it
  printed its address), the demo study's line and `autotune doctor`.
- README, GPU quick start: its train.py and args.json in a folder (its `cd`), its
  override (TRAIN_MODEL, TRAIN_DATA) naming a tiny local chat model and conversations;
  `--device cpu` on the search where there is no GPU.
- examples/README.md: each command of its blocks (as a shell reads them), from a copy of
  `examples/`; then the `tune_on_local_text.py WORKDIR` its prose describes.

    python benchmarks/docs_as_written.py [--record] [--work DIR] [--only readme]  # or examples
    python benchmarks/docs_as_written.py --quick  # the README's demo study and doctor only

tests/test_readme.py checks the same blocks without running them; this runs them all
(about 45 minutes on 2 cores: the searches keep their written time budgets).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import ENV, ROOT, Benchmark, Figures, header, run, table

sys.path.insert(0, str(ROOT / "tests"))
from job_script import write_chat_job

INSTALL = 'pip install torch && pip install -e ".[peft]"'
SERVE_S = 15.0  # how long `autotune dashboard` serves before it is stopped


def try_out(readme: str) -> list[str]:
    """The README's CPU try-out: the command its install line runs last."""
    line = next(x.strip() for x in readme.splitlines() if "autotune search --model" in x)
    return [line.rsplit(" && ", 1)[-1]]


def gpu_block(readme: str) -> list[str]:
    """The commands of the README's GPU quick start after its install line, in order."""
    block = readme.split(INSTALL, 1)[1]
    lines = [line.strip() for line in block.split("\n\n", 1)[0].splitlines()]
    return [line for line in lines if line]


def review_block(readme: str) -> list[str]:
    """The README's "Review a study" block."""
    section = readme.split("## Review a study", 1)[1]
    return shell_commands(section.split("\n## ", 1)[0])


def doctor(readme: str) -> list[str]:
    """The README's "Check the machine first" line, without its comment."""
    return _indented(readme.split("## Check the machine first", 1)[1].split("\n## ", 1)[0])


def demo(readme: str) -> list[str]:
    """The README's line that reads the recorded study under examples/demo/."""
    section = readme.split("## Review a study", 1)[1].split("\n## ", 1)[0]
    return _indented(re.sub(r"```.*?```", "", section, flags=re.S))


def _indented(markdown: str) -> list[str]:
    lines = markdown.splitlines()
    return [x.split(" #", 1)[0].strip() for x in lines if x.startswith("    ") and x.strip()]


def shell_commands(markdown: str) -> list[str]:
    """Every command of the document's ``` blocks, in order: comments dropped, a line
    ending in a backslash joined with the next, as a shell reads them."""
    commands = []
    for block in re.findall(r"```\n(.*?)```", markdown, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                commands.append(line)
    return commands


def prepare_readme(work: Path, readme: str) -> dict[str, str]:
    """train.py and args.json as the README writes them, and the quick start's override:
    the environment naming a tiny local model and data set in place of the hub's."""
    (script,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "# train.py" in b]
    (args_json,) = re.findall(r"```json\n(.*?)```", readme, re.S)
    (work / "train.py").write_text(script)
    (work / "args.json").write_text(args_json)
    model, data = write_chat_job(work / "offline")
    return {"TRAIN_MODEL": str(model), "TRAIN_DATA": str(data)}


def on_this_machine(command: str, gpu: bool) -> str:
    """The one substitution: a search written for a GPU runs on the CPU here."""
    if command.startswith("autotune search") and "--device" not in command and not gpu:
        return command + " --device cpu"
    return command


class Runner:
    """Runs commands with this interpreter's environment (`autotune` and `python`)."""

    def __init__(self) -> None:
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        self.env = {**ENV, "PATH": path}
        self.rows: list[tuple[str, str, int, int]] = []

    def run(self, where: str, command: str, cwd: Path, env: dict[str, str] | None = None) -> int:
        print(f"\n$ {command}   (in {cwd})", flush=True)
        started = time.monotonic()
        if command.startswith("autotune dashboard"):
            code = self.serve(command, cwd)
        else:
            environment = {**self.env, **(env or {})}
            code = subprocess.run(command, shell=True, cwd=cwd, env=environment).returncode
        self.rows.append((where, command, code, round(time.monotonic() - started)))
        return code

    def serve(self, command: str, cwd: Path, seconds: float = SERVE_S) -> int:
        """A server runs until stopped: 0 when it printed its address and was still
        serving `seconds` later (then stopped, as Ctrl-C stops it), else its exit code."""
        server = subprocess.Popen(
            command,
            shell=True,
            cwd=cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # Ctrl-C reaches the shell and the server alike
        )
        time.sleep(seconds)
        if server.poll() is not None:
            print(server.stdout.read() if server.stdout else "")
            return server.returncode or 1
        os.killpg(server.pid, signal.SIGINT)
        try:
            out, _ = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            out, _ = server.communicate()
            print(out)
            return 1
        print(out)
        return 0 if "http://" in out else 1


def readme_blocks(runner: Runner, work: Path, gpu: bool, quick: bool) -> dict[str, object]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    cpu = work / "readme-try-out"
    cpu.mkdir()
    shutil.copytree(ROOT / "examples", cpu / "examples")
    steps = [("README, demo study", demo(readme)), ("README, doctor", doctor(readme))]
    if not quick:
        steps[:0] = [
            ("README, CPU try-out", try_out(readme)),
            ("README, review", review_block(readme)),
        ]
    for where, commands in steps:
        for command in commands:
            runner.run(where, command, cpu)
    if quick:
        return {}
    block = work / "readme-gpu"
    block.mkdir()
    override = prepare_readme(block, readme)
    before = json.loads((block / "args.json").read_text())
    for command in gpu_block(readme):
        if command.startswith("cd "):
            continue  # into the folder of train.py and args.json: `block` is that folder
        code = runner.run("README, GPU quick start", on_this_machine(command, gpu), block, override)
        if code != 0:
            break
    after = json.loads((block / "args.json").read_text())
    return {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}


def example_blocks(runner: Runner, work: Path) -> None:
    folder = work / "examples-readme"
    folder.mkdir()
    shutil.copytree(ROOT / "examples", folder / "examples")
    markdown = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    for command in [*shell_commands(markdown), "python examples/tune_on_local_text.py local-text"]:
        runner.run("examples/README.md", command, folder)


def measure(args: argparse.Namespace, work: Path) -> Figures:
    import torch

    work = args.work or work
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner()
    changed: dict[str, object] = {}
    if args.only in (None, "readme"):
        changed = readme_blocks(runner, work, torch.cuda.is_available(), args.quick)
    if args.only in (None, "examples") and not args.quick:
        example_blocks(runner, work)
    return {"commands": runner.rows, "args_json_changed": changed}


def report(f: Figures) -> str:
    rows = [(where, f"`{c}`", code, f"{s} s") for where, c, code, s in f["commands"]]
    changed = f["args_json_changed"]
    return (
        header(f, "The docs, as written")
        + "\n"
        + table(("document", "command", "exit", "wall"), rows)
        + (f"\nThe README's args.json, changed by its export: {changed}\n" if changed else "")
    )


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--work", type=Path, help="a folder to keep [default: a temporary one]")
    parser.add_argument("--only", choices=["readme", "examples"], help="one document")


if __name__ == "__main__":
    done = run(Benchmark("docs_as_written", __doc__, measure, report, options))
    sys.exit(max((code for _, _, code, _ in done["commands"]), default=0))
