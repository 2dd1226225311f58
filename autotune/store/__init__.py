"""Persistence: the only code that touches Optuna storage.

`StudyStore` is the way in: the records. Its parts are `StudyStore.queue`
(`queue.StudyQueue`: the workers' queue, claims, heartbeats and stale trials) and
`StudyStore.settings` (`_settings.StudySettings`: the study's own attributes). Inside:
`_coordination` (the rules of claims and heartbeats), `_identity` (is a stored study
the same search), `_params` (a candidate as Optuna parameters) and `_retry` (an
unreachable storage). A public name imports
its module (and Optuna) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._exports import lazy_exports

if TYPE_CHECKING:
    from autotune.store.compat import study_id
    from autotune.store.keys import Attr
    from autotune.store.queue import Asked, TrialLost
    from autotune.store.reuse import Reuse
    from autotune.store.samplers import make_sampler
    from autotune.store.storage import STORAGE_ENV, mask
    from autotune.store.store import StudyStore

__all__ = [
    "STORAGE_ENV",
    "Asked",
    "Attr",
    "Reuse",
    "StudyStore",
    "TrialLost",
    "make_sampler",
    "mask",
    "study_id",
]

# each public name, and the module that holds it
_OWNERS = {
    "study_id": "autotune.store.compat",
    "Attr": "autotune.store.keys",
    "Reuse": "autotune.store.reuse",
    "make_sampler": "autotune.store.samplers",
    "STORAGE_ENV": "autotune.store.storage",
    "mask": "autotune.store.storage",
    "Asked": "autotune.store.queue",
    "StudyStore": "autotune.store.store",
    "TrialLost": "autotune.store.queue",
}
__getattr__ = lazy_exports(__name__, _OWNERS)
