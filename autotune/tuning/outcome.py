"""What a search hands back: the study loop's report (`SearchReport`) and the whole
search's outcome, the exported config with the figures the end of a search shows
(`SearchOutcome`). Plain values: views read them without importing the search."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from autotune.core.stats import SpeedRatio
from autotune.core.trial import TrialRecord
from autotune.hf.training_args import arguments_class


@dataclasses.dataclass(frozen=True)
class SearchReport:
    study_name: str
    records: tuple[TrialRecord, ...]
    probes_this_run: int
    elapsed_s: float
    stop_reason: str


@dataclasses.dataclass(frozen=True)
class SearchOutcome:
    """What `autotune.search` returns: the exported config (`best`, written to `output`),
    how the search ended, what changed against your recipe with its parity verdict
    (`parity`), the speed over your recipe or the plain default (`versus_default`), and
    `arguments()`, the export as an object of your arguments class."""

    study_name: str
    best: TrialRecord
    output: Path
    probes_this_run: int
    elapsed_s: float
    stop_reason: str
    parity: dict[str, Any]  # views.export.parity_summary: what changed, and its verdict
    train_steps: int = 0  # the user's run length, when selection ranked by time to finish
    # what the best is compared with, when measured: the user's recipe (their --base-args
    # or their arguments class's defaults, as autotune runs it), else the plain default
    # (fp32 AdamW at the smallest batch); the best's speed over it, and its name
    default: TrialRecord | None = None
    versus_default: SpeedRatio | None = None
    baseline: str = "the plain default"
    args_class: str = ""  # your factory's arguments class; "": TrainingArguments
    # what your script needs besides the arguments file (views.export.script_changes)
    script_changes: tuple[str, ...] = ()

    def arguments(self) -> Any:
        """The exported arguments as an object of your class (`SFTConfig` stays
        `SFTConfig`), read with HfArgumentParser as your script reads the file; its
        other keys (model or data fields of yours) are left to your own parser."""
        # only here: `autotune.load` and the views read an outcome without transformers
        from transformers import HfArgumentParser

        parser = HfArgumentParser(arguments_class(self.args_class))
        (args,) = parser.parse_json_file(self.output, allow_extra_keys=True)
        return args
