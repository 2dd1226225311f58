"""The survey of the user's job, forked from the search's fork server once its imports
are done (a fresh interpreter paid them a second time: 8 s here), and in a fresh
interpreter where the server cannot run it."""

from __future__ import annotations

import importlib
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from job_script import BASE_ARGS, write_job

from autotune.core.errors import LaunchError
from autotune.core.job import FACTS_NAME
from autotune.launch import survey
from autotune.launch.forkserver import PRELOAD, EarlyServer, serve
from autotune.launch.survey import FactoryFailed, survey_job

HANGS = """

def hangs(args):
    import time

    time.sleep(600)
"""


def _survey(script: Path, factory: str, server: EarlyServer | None, timeout_s: float) -> Any:
    return survey_job(
        trainer=f"{script}:{factory}",
        args_class=None,
        fields=dict(BASE_ARGS),
        recipe=dict(BASE_ARGS),
        seed=0,
        timeout_s=timeout_s,
        use_cpu=True,
        server=server,
    )


@pytest.mark.slow
def test_the_survey_forks_from_the_search_server_and_a_hung_factory_leaves_it_in_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = write_job(tmp_path / "job")
    script.write_text(script.read_text() + HANGS)
    fresh: list[Path] = []
    real_fresh = survey._fresh

    def counted(request: Path, log: Path, timeout_s: float) -> int | None:
        fresh.append(request)
        return real_fresh(request, log, timeout_s)

    monkeypatch.setattr(survey, "_fresh", counted)
    server = EarlyServer()
    try:
        with pytest.raises(FactoryFailed, match=r"job.py:hangs did not return a Trainer within"):
            _survey(script, "hangs", server, timeout_s=5)  # from the fork, its imports done
        facts = _survey(script, "make_trainer", server, timeout_s=120)
        assert fresh == []  # both ran in the server's children
        assert facts.trainable and facts.args_class.endswith("SFTConfig")
        pids = [line.split()[0] for line in (script.parent / "calls.log").read_text().splitlines()]
        assert len(pids) == 1 and server.process and int(pids[0]) != server.process.pid  # a child
    finally:
        server.discard()


@pytest.mark.slow
def test_a_server_that_died_leaves_the_survey_to_a_fresh_interpreter(tmp_path: Path) -> None:
    script = write_job(tmp_path / "job")
    server = EarlyServer()
    server.discard()  # as one whose imports failed
    facts = _survey(script, "make_trainer", server, timeout_s=120)
    assert facts.trainable


def test_a_server_that_declines_the_survey_stays_for_the_probes(tmp_path: Path) -> None:
    """A server whose imports initialised CUDA declines (a forked child could not use
    the GPU) with a LaunchError, on which survey_job runs the survey fresh (as for the
    dead server above); the server, still in step, is kept for the probes."""
    answers = 'import sys; sys.stdin.readline(); print(\'{"error": "CUDA"}\', flush=True)'
    server = EarlyServer()
    server.discard()
    server.process = subprocess.Popen(
        [sys.executable, "-c", answers], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
    )
    try:
        with pytest.raises(LaunchError, match="declined the survey: CUDA"):
            server.survey(tmp_path / "request.json", tmp_path / "stderr.log", timeout_s=10)
        assert server.process is not None  # not discarded
    finally:
        server.discard()


def test_a_server_whose_imports_initialised_cuda_declines_the_survey_for_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's own check, run here on a CPU whose torch says CUDA was initialised
    (as bitsandbytes' import through peft once did): `serve` declines the survey, and
    the parent, given that reply, surveys in a fresh interpreter and keeps the server,
    still in step, for the probes."""
    import torch

    for name in PRELOAD:  # serve's imports, done before torch is told anything
        importlib.import_module(name)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # serve sets it: undone after
    asked = {"job": str(tmp_path / "request.json"), "stdout": os.devnull, "stderr": os.devnull}
    replies = io.StringIO()
    interrupt = signal.getsignal(signal.SIGINT)
    try:
        serve(io.StringIO(json.dumps(asked) + "\n"), replies)  # the survey, then no setup
    finally:
        signal.signal(signal.SIGINT, interrupt)
    (reply,) = replies.getvalue().splitlines()  # no child forked: no pid, no status
    assert "pid" not in json.loads(reply)

    fresh: list[Path] = []

    def surveyed_afresh(request: Path, log: Path, timeout_s: float) -> int:
        fresh.append(request)
        request.with_name(FACTS_NAME).write_text(json.dumps({"error": "surveyed afresh"}))
        return 1

    monkeypatch.setattr(survey, "_fresh", surveyed_afresh)
    replays = (
        "import sys; sys.stdin.readline(); print(sys.argv[1], flush=True); sys.stdin.readline()"
    )
    server = EarlyServer()
    server.discard()
    server.process = subprocess.Popen(
        [sys.executable, "-c", replays, reply],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        bufsize=0,
    )
    try:
        with pytest.raises(FactoryFailed, match="surveyed afresh"):
            _survey(tmp_path / "job.py", "make_trainer", server, timeout_s=10)
        assert len(fresh) == 1 and server.process is not None  # kept for the probes
    finally:
        server.discard()
