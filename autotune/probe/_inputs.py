"""What the probe's parts take: `run_probe` reads the trial's config once and hands each
part the values below, or the few plain ones it uses, so a part's parameters say what
it depends on."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from autotune.core.enums import DeviceKind, Task
from autotune.core.trial import Candidate, ModelSpec


@dataclasses.dataclass(frozen=True)
class Workload:
    """The training a probe runs: the model, trained with the candidate's arguments
    (`recipe`, what export writes) from `seed`, on worst-case samples (a stand-in's at
    `seq_len` and `target_len` tokens; a user's job's longest samples, longest first)
    over `processes` processes."""

    model: ModelSpec
    candidate: Candidate
    recipe: dict[str, Any]
    seed: int
    seq_len: int
    target_len: int
    processes: int = 1
    longest_samples: tuple[int, ...] = ()

    @property
    def global_batch_size(self) -> int:
        c = self.candidate
        return c.per_device_train_batch_size * c.gradient_accumulation_steps * self.processes

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len + (self.target_len if self.model.task == Task.SEQ2SEQ else 0)


@dataclasses.dataclass(frozen=True)
class Measurement:
    """How a probe measures its steps: `warmup_steps` of warm-up, then `measure_steps`
    timed, or (`min_window_s` > 0) until the window lasts that long; `adaptive`: each
    ended by core/schedule.py's rules, against the incumbent's cost (`incumbent_s`; with
    `train_steps`, the time to finish the user's run)."""

    warmup_steps: int
    measure_steps: int
    min_window_s: float = 0.0
    adaptive: bool = False
    incumbent_s: float | None = None
    train_steps: int = 0


@dataclasses.dataclass(frozen=True)
class TheirData:
    """The user's data, timed after the worst case: their tokenized data (`path`,
    --dataset) padded with `pad_token_id`, or their own job's batches (`own_batches`);
    `sample_tokens`, their mean sample length, counts a packed step's tokens in samples."""

    path: str = ""
    pad_token_id: int = 0
    own_batches: bool = False
    sample_tokens: float = 0.0


@dataclasses.dataclass(frozen=True)
class Site:
    """Where a probe runs: its device (the kind, and the index among the GPUs it sees),
    the trial's folder, where its trainers write, and its node's rank (the head's 0)."""

    kind: DeviceKind
    index: int
    trial_dir: str
    node_rank: int = 0

    @property
    def first(self) -> bool:
        """The run's first process on the head's node: the one that writes what the run
        writes once (a rehearsal's events). Across nodes torchrun's global rank 0 may be
        on another node, where the head would not read it."""
        return self.node_rank == 0 and os.environ.get("LOCAL_RANK", "0") == "0"
