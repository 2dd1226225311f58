"""What a study holds about training parity: the reference, the runs' curves, the
verdicts by arithmetic and the tolerance, as one value stored in the study (and the
user's leave to export unverified verdicts); and the length of its runs that --parity
auto planned (`ParityPlan`). Judging a run is `core/parity.py`."""

from __future__ import annotations

import dataclasses
import json

from autotune.core.parity import UNPAIRED, Arithmetic, Curve, Tolerance
from autotune.core.parity_verdict import Parity, Status
from autotune.core.trial import Candidate


@dataclasses.dataclass(frozen=True)
class ParityState:
    """What a study holds about parity: the reference, the runs and the verdicts."""

    reference: Candidate  # per process, as the study's candidates are
    steps: int
    learning_rate: float
    seed: int = 0
    curves: dict[str, Curve] = dataclasses.field(default_factory=dict)  # "reference", "twin", keys
    verdicts: dict[str, Parity] = dataclasses.field(default_factory=dict)  # by arithmetic key
    tolerance: Tolerance | None = None
    # the user allows unverified verdicts to be exported (--parity quick): a policy of
    # the latest search, not part of the setup runs are compared under
    quick: bool = False

    def verdict(self, candidate: Candidate) -> Parity | None:
        """The candidate's verdict; None when its arithmetic was not checked."""
        if Arithmetic.of(candidate) == Arithmetic.of(self.reference):
            return Parity(Status.SAME)
        if candidate.levers.changes_samples and not self.reference.levers.changes_samples:
            return UNPAIRED
        found = self.verdicts.get(Arithmetic.of(candidate).key)
        if found is not None and found.status == Status.UNVERIFIED:
            return dataclasses.replace(found, allowed=self.quick)
        return found

    def same_setup(self, other: ParityState) -> bool:
        """Whether runs made under `other`'s settings can be compared with these."""
        return (Arithmetic.of(other.reference), other.steps, other.learning_rate, other.seed) == (
            Arithmetic.of(self.reference),
            self.steps,
            self.learning_rate,
            self.seed,
        )

    def retrying(self) -> ParityState:
        """This state less what did not finish (unchecked verdicts, failed reference or
        twin runs): a rerun of the search tries them again."""
        curves = {
            k: c for k, c in self.curves.items() if not (k in ("reference", "twin") and c.error)
        }
        if "reference" not in curves:
            curves.pop("twin", None)
        verdicts = {k: v for k, v in self.verdicts.items() if v.status != Status.UNCHECKED}
        return dataclasses.replace(self, curves=curves, verdicts=verdicts)

    def to_json(self) -> str:
        return json.dumps(
            {
                "reference": dataclasses.asdict(self.reference),
                "steps": self.steps,
                "learning_rate": self.learning_rate,
                "seed": self.seed,
                "curves": {k: c.to_dict() for k, c in self.curves.items()},
                "verdicts": {k: dataclasses.asdict(v) for k, v in self.verdicts.items()},
                "tolerance": dataclasses.asdict(self.tolerance) if self.tolerance else None,
                "quick": self.quick,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> ParityState:
        raw = json.loads(text)
        return cls(
            reference=Candidate(**raw["reference"]),
            steps=int(raw["steps"]),
            learning_rate=float(raw["learning_rate"]),
            seed=int(raw.get("seed", 0)),
            curves={k: Curve.from_dict(c) for k, c in raw["curves"].items()},
            verdicts={k: Parity.from_dict(v) for k, v in raw["verdicts"].items()},
            tolerance=Tolerance(**raw["tolerance"]) if raw["tolerance"] else None,
            quick=bool(raw.get("quick", False)),
        )


@dataclasses.dataclass(frozen=True)
class ParityPlan:
    """The parity runs' length for a study, and why (stored in the study, so workers and
    a resumed search keep it)."""

    steps: int
    quick: bool  # unverified verdicts may be exported, saying so
    why: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ParityPlan:
        return cls(**json.loads(text))
