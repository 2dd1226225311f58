"""The parent side of a trial: launching the probe child and classifying how it ended,
the fork server, and the survey of the user's job.

`forkserver` is started by name (`python -m autotune.launch.forkserver`): that module
name is a protocol between processes and stays public. A public name imports its module
on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._exports import lazy_exports

if TYPE_CHECKING:
    from autotune.launch.forkserver import ForkServer, model_to_share
    from autotune.launch.runner import Launcher, run_trial
    from autotune.launch.survey import survey_job

__all__ = [
    "ForkServer",
    "Launcher",
    "model_to_share",
    "run_trial",
    "survey_job",
]

# each public name, and the module that holds it
_OWNERS = {
    "ForkServer": "autotune.launch.forkserver",
    "model_to_share": "autotune.launch.forkserver",
    "Launcher": "autotune.launch.runner",
    "run_trial": "autotune.launch.runner",
    "survey_job": "autotune.launch.survey",
}
__getattr__ = lazy_exports(__name__, _OWNERS)
