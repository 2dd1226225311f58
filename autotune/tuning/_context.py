"""What the phases of a search (exploring, parity, confirming, the rehearsal) use of the
search run they serve.

`tuning.run.SearchRun` is one; they are typed against this, so none imports the run
that calls them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialConfig, TrialResult, Verdict
from autotune.launch.runner import Launcher
from autotune.store.reuse import Reuse
from autotune.store.store import StudyStore
from autotune.tuning.limits import Observer, SearchLimits


class RunContext(Protocol):
    spec: SearchSpec
    store: StudyStore
    reuse: Reuse | None  # other studies' measurements of this search's configs
    limits: SearchLimits
    observer: Observer
    launcher: Launcher
    probes: int  # launched by this process
    started: float  # when it started (time.monotonic)
    rehearses: bool  # the config to export must pass a rehearsal
    judge: Callable[[TrialResult], Verdict]  # a result's verdict in this study
    said: set[str]  # lines said once this run

    def trial_config(
        self,
        number: int,
        candidate: Candidate,
        folder: str,
        *,
        measure_steps: int = 0,
        concurrent: int = 0,
        adaptive: bool = False,
        incumbent_s: float | None = None,
    ) -> TrialConfig:
        """A probe's config of this study, its files in the study's `folder`."""
