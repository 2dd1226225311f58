"""The survey of the user's job, forked from the search's fork server once its imports
are done (a fresh interpreter paid them a second time: 8 s here), and in a fresh
interpreter where the server cannot run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from job_script import BASE_ARGS, write_job

from autotune.core.errors import LaunchError
from autotune.launch import survey
from autotune.launch.forkserver import EarlyServer
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
