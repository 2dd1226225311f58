"""Measurements reused across studies (issue #15): a config another study in the same
storage already measured, with the same model, device, lengths, recipe fields, processes,
data and library versions, is not probed again; its figures are taken over and marked
with where they came from.

What carries over, so that the budget is still enforced and not only compared:
- a clean measurement made under a limit no larger than this study's (it ran under a
  tighter one), or whose peak is at least MARGIN below this study's limit (the limit
  counts reserved pages, a few percent above the resident peak); one near or over the
  new limit is probed again, under it, so it really fits or really runs out of memory;
- an out-of-memory under a limit at least as high as this study's;
- a loss that went NaN with the same seed (the same weights and batches).
Figures measured while other probes shared the cores are reused only by a search that
shares them alike; a search timing every step (--fixed-steps) reuses only whole
windows. A reused measurement is never reused again: only originals carry.
"""

from __future__ import annotations

import dataclasses

import optuna

from autotune.core.device import measuring_environment
from autotune.core.enums import Outcome
from autotune.core.errors import StudyError
from autotune.core.parity_state import ParityState
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialRecord, TrialResult
from autotune.store._retry import transient_retry
from autotune.store.keys import StudyAttr
from autotune.store.store import StudyStore

MARGIN = 0.9  # a peak measured under a larger limit: reused below 90% of this one


@dataclasses.dataclass(frozen=True)
class Source:
    """A study whose measurements may stand for this one's."""

    name: str
    spec: SearchSpec
    records: tuple[TrialRecord, ...]
    parity: ParityState | None = None  # its training-parity runs and verdicts


class Reuse:
    """The reusable measurements of a search, by config."""

    def __init__(
        self,
        spec: SearchSpec,
        sources: list[Source],
        *,
        versions: dict[str, str],
        concurrent: int = 1,
        whole_windows: bool = False,
    ) -> None:
        self.found: dict[Candidate, TrialResult] = {}
        # parity runs of a source whose probes are reused (so made with these versions)
        self.parity: list[tuple[str, ParityState]] = []
        for source in sources:
            taken = 0
            for record in source.records:
                result = _reusable(record, source, spec, versions, concurrent, whole_windows)
                if result is not None and record.candidate not in self.found:
                    self.found[record.candidate] = result
                    taken += 1
            if taken and source.parity is not None:
                self.parity.append((source.name, source.parity.retrying()))

    @classmethod
    @transient_retry  # read-only: a storage away is waited out and the whole read again
    def gather(
        cls, store: StudyStore, *, concurrent: int = 1, whole_windows: bool = False
    ) -> Reuse:
        """Every other study in the store's storage that measured what this one would
        (one that cannot be read, made by another autotune version say, is passed over)."""
        wanted = store.spec.measurement_identity()
        sources = []
        summaries = optuna.get_all_study_summaries(store.storage, include_best_trial=False)
        for summary in summaries:
            raw = summary.user_attrs.get(StudyAttr.SPEC)
            if summary.study_name == store.name or raw is None:
                continue
            try:
                other = SearchSpec.from_json(raw)
            except (ValueError, TypeError, KeyError, RecursionError):  # another version's
                continue
            if other.measurement_identity() != wanted:
                continue
            try:
                study = optuna.load_study(study_name=summary.study_name, storage=store.storage)
                found = StudyStore(study, store.storage, store.url, other)
                records, parity = found.records(), found.settings.parity()
            except (StudyError, ValueError, TypeError, KeyError):  # results it cannot read
                continue
            sources.append(Source(summary.study_name, other, tuple(records), parity))
        return cls(
            store.spec,
            sources,
            versions=measuring_environment(),
            concurrent=concurrent,
            whole_windows=whole_windows,
        )

    def parity_runs(self, wanted: ParityState) -> tuple[str, ParityState] | None:
        """Another study's parity runs made the way this one's would be (the reference's
        arithmetic, steps, learning rate and seed; the same model, data and versions),
        with its reference curve: (its name, its state)."""
        for name, state in self.parity:
            if state.same_setup(wanted) and "reference" in state.curves:
                return name, state
        return None

    def __len__(self) -> int:
        return len(self.found)


def _reusable(
    record: TrialRecord,
    source: Source,
    spec: SearchSpec,
    versions: dict[str, str],
    concurrent: int,
    whole_windows: bool,
) -> TrialResult | None:
    result = record.result
    if result.reused_from or result.concurrent != concurrent:
        return None
    if any(result.versions.get(name) != version for name, version in versions.items()):
        return None
    if whole_windows and result.measure_stop not in ("", "full window"):
        return None
    peak = result.peak_memory_bytes
    tighter = source.spec.fit_limit_bytes <= spec.fit_limit_bytes
    ok = (
        result.outcome == Outcome.OK
        and result.samples_per_s
        and peak is not None
        and (tighter or peak <= MARGIN * spec.fit_limit_bytes)
    )
    oom = result.outcome == Outcome.OOM and spec.fit_limit_bytes <= source.spec.fit_limit_bytes
    nan = result.outcome == Outcome.UNSTABLE and spec.seed == source.spec.seed
    if not (ok or oom or nan):
        return None
    return result.replace(reused_from=f"study {source.name} trial {record.number}")
