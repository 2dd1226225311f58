"""Measurements reused across studies (issue #15): a config another study in the same
storage already measured, with the same model, device, lengths, recipe fields, processes,
data and library versions, is not probed again; its figures are taken over and marked
with where they came from.

What carries over: a clean measurement (throughput and peak; the new budget judges the
peak, so a study with a smaller budget reuses every trial that fits it and knows the rest
do not); an out-of-memory under a limit at least as high as this study's (it would fail
here too); a loss that went NaN with the same seed (the same weights and batches).
Figures measured while other probes shared the cores are reused only by a search that
shares them alike. A reused measurement is never reused again: only originals carry.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform

import optuna

from autotune.core.enums import Outcome
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialRecord, TrialResult
from autotune.store.keys import StudyAttr
from autotune.store.store import StudyStore

VERSIONED = ("torch", "transformers")


def current_versions() -> dict[str, str]:
    """The versions a probe of this environment records (without importing torch)."""
    found = {name: importlib.metadata.version(name) for name in VERSIONED}
    return {**found, "python": platform.python_version()}


@dataclasses.dataclass(frozen=True)
class Source:
    """A study whose measurements may stand for this one's."""

    name: str
    spec: SearchSpec
    records: tuple[TrialRecord, ...]


class Reuse:
    """The reusable measurements of a search, by config."""

    def __init__(
        self, spec: SearchSpec, sources: list[Source], *, versions: dict[str, str],
        concurrent: int = 1,
    ) -> None:  # fmt: skip
        self.found: dict[Candidate, TrialResult] = {}
        for source in sources:
            for record in source.records:
                result = _reusable(record, source, spec, versions, concurrent)
                if result is not None and record.candidate not in self.found:
                    self.found[record.candidate] = result

    @classmethod
    def gather(cls, store: StudyStore, *, concurrent: int = 1) -> Reuse:
        """Every other study in the store's storage that measured what this one would."""
        wanted = store.spec.measurement_identity()
        sources = []
        summaries = optuna.get_all_study_summaries(store.storage, include_best_trial=False)
        for summary in summaries:
            raw = summary.user_attrs.get(StudyAttr.SPEC)
            if summary.study_name == store.name or raw is None:
                continue
            try:
                other = SearchSpec.from_json(raw)
            except (ValueError, TypeError, KeyError):  # a spec of another autotune version
                continue
            if other.measurement_identity() != wanted:
                continue
            study = optuna.load_study(study_name=summary.study_name, storage=store.storage)
            records = StudyStore(study, store.storage, store.url, other).records()
            sources.append(Source(summary.study_name, other, tuple(records)))
        return cls(store.spec, sources, versions=current_versions(), concurrent=concurrent)

    def find(self, candidate: Candidate) -> TrialResult | None:
        return self.found.get(candidate)

    def __len__(self) -> int:
        return len(self.found)


def _reusable(
    record: TrialRecord, source: Source, spec: SearchSpec, versions: dict[str, str],
    concurrent: int,
) -> TrialResult | None:  # fmt: skip
    result = record.result
    if result.reused_from or result.concurrent != concurrent:
        return None
    if any(result.versions.get(name) != version for name, version in versions.items()):
        return None
    ok = result.outcome == Outcome.OK and result.samples_per_s and result.peak_memory_bytes
    oom = result.outcome == Outcome.OOM and spec.fit_limit_bytes <= source.spec.fit_limit_bytes
    nan = result.outcome == Outcome.UNSTABLE and spec.seed == source.spec.seed
    if not (ok or oom or nan):
        return None
    return result.replace(reused_from=f"study {source.name} trial {record.number}")
