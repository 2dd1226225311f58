"""Before a search of the user's own job: build it once in a child process
(`python -m autotune.probe.job`) and read what their factory built (`JobFacts`).

In a child, as every probe: the user's module may load a model, initialise CUDA or
crash, and none of that may touch the search process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from autotune.core.errors import LaunchError, UsageError
from autotune.core.files import read_json
from autotune.core.job import FACTS_NAME, JobFacts, SurveyServer
from autotune.system.process import child_env, dies_with, stop


class FactoryFailed(UsageError):
    """The user's factory raised, returned no Trainer, or ignored its arguments."""


def survey_job(
    *,
    trainer: str,
    args_class: str | None,
    fields: dict[str, Any],
    recipe: dict[str, Any],
    seed: int,
    timeout_s: float,
    use_cpu: bool,
    server: SurveyServer | None = None,
) -> JobFacts:
    """What `trainer` builds from the user's `fields` (and the recipe their own arguments,
    `recipe`, make in their class); FactoryFailed with the one-line reason (the
    factory's exception, as its traceback's last line) when it cannot. `server`: the
    search's fork server, started ahead: the child is forked from it once its imports
    are done, so the survey does not pay them a second time (8 s here); where it cannot,
    a fresh interpreter runs it."""
    device = {"use_cpu": True} if use_cpu else {}
    request = {
        "trainer": trainer,
        "args_class": args_class,
        "fields": fields | device,
        "recipe": recipe | device,
        "seed": seed,
        "visible_devices": "" if use_cpu else None,
    }
    with tempfile.TemporaryDirectory(prefix="autotune-job-") as folder:
        path = Path(folder) / "request.json"
        path.write_text(json.dumps(request), encoding="utf-8")
        log = Path(folder) / "stderr.log"
        try:
            returncode = (
                server.survey(path, log, timeout_s) if server else _fresh(path, log, timeout_s)
            )
        except LaunchError:  # the server could not run it: a fresh interpreter does
            returncode = _fresh(path, log, timeout_s)
        if returncode is None:
            raise FactoryFailed(
                f"{_name(trainer)} did not return a Trainer within {timeout_s:.0f} s "
                "(raise --trial-timeout if building your job takes longer)"
            )
        answer = _answer(path.with_name(FACTS_NAME), log, returncode)
    return _facts(answer, trainer)


def _facts(answer: dict[str, Any], trainer: str) -> JobFacts:
    """The facts the child answered; FactoryFailed with its one-line error otherwise."""
    if "facts" in answer:
        try:
            return JobFacts.from_json(json.dumps(answer["facts"]))
        except ValueError as exc:  # written by another autotune than this one
            raise FactoryFailed(
                f"building {_name(trainer)} answered facts this autotune cannot read ({exc}); "
                "reinstall autotune so that the search and its probes are one version"
            ) from None
    error = (str(answer["error"]).strip().splitlines() or ["no reason given"])[0]
    if answer.get("raised"):
        raise FactoryFailed(f"{_name(trainer)} raised {error}")
    raise FactoryFailed(error)


def _fresh(request: Path, log: Path, timeout_s: float) -> int | None:
    """The survey in a fresh interpreter: its exit status, None past the timeout."""
    with open(log, "wb") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "autotune.probe.job", str(request)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=child_env(),
            start_new_session=True,
            preexec_fn=dies_with(os.getpid()),
        )
        try:
            return child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            stop(child)


def _answer(path: Path, log: Path, returncode: int | None) -> dict[str, Any]:
    """The child's answer: {"facts": ...}, or {"error": its one line, "raised": ...};
    where it wrote neither (it died, or wrote something else), its log's last line."""
    try:
        answer = read_json(path)
    except (OSError, ValueError):
        answer = None
    if isinstance(answer, dict) and ("facts" in answer or isinstance(answer.get("error"), str)):
        return answer
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        lines = []
    last = lines[-1] if lines else f"exit status {returncode}"
    return {"error": f"building your job crashed: {last[:300]}", "raised": False}


def _name(trainer: str) -> str:
    location, _, name = trainer.rpartition(":")
    return f"{Path(location).name}:{name}" if location.endswith(".py") else trainer
