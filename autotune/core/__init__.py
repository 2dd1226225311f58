"""The typed values every part shares: trials, the space, the search spec, units, errors.

Pure Python: nothing here imports torch, transformers, Optuna or click, so the package
re-exports its public names eagerly. Every module is used by other packages.
"""

from __future__ import annotations

from autotune.core.checkpointing import Checkpointing
from autotune.core.dataset import DataSpec, LengthStats
from autotune.core.device import DeviceInfo, measuring_environment, supported_precisions
from autotune.core.enums import DeviceKind, Objective, Outcome, Precision, SamplerName, Task, values
from autotune.core.errors import (
    AutotuneError,
    ExportError,
    LaunchError,
    ModelConfigError,
    ModelNotFoundError,
    NoFitError,
    StudyError,
    Terminated,
    TrialFilesError,
    UsageError,
    raise_terminated,
)
from autotune.core.files import write_atomic
from autotune.core.job import FACTS_NAME, BaseArguments, JobFacts, ParameterCount
from autotune.core.outcomes import classify_exit, failure_line, is_out_of_memory, loss_outcome
from autotune.core.parity import (
    CALIBRATED_STEPS,
    EVAL_SAMPLES,
    POINTS,
    Arithmetic,
    Change,
    Curve,
    changes,
    judge,
    needs_twin,
    tolerance,
)
from autotune.core.parity_state import ParityPlan, ParityState
from autotune.core.parity_verdict import Parity
from autotune.core.paths import (
    DEFAULT_STUDIES,
    check_study_name,
    claim_folder,
    default_storage,
    default_study_name,
    study_folder,
)
from autotune.core.schedule import CLEARLY_SLOWER, Schedule
from autotune.core.space import SearchSpace, batch_choices, derive_space, seed_candidates
from autotune.core.spec import SearchSpec
from autotune.core.stats import SpeedRatio, StepStats, combine, pooled, quiet_step_s, speed_ratio
from autotune.core.trial import (
    LEVERS,
    Candidate,
    ModelSpec,
    TrialConfig,
    TrialRecord,
    TrialResult,
    Verdict,
)
from autotune.core.units import format_duration, format_size, parse_duration, parse_size

__all__ = [
    "CALIBRATED_STEPS",
    "CLEARLY_SLOWER",
    "DEFAULT_STUDIES",
    "EVAL_SAMPLES",
    "FACTS_NAME",
    "LEVERS",
    "POINTS",
    "Arithmetic",
    "AutotuneError",
    "BaseArguments",
    "Candidate",
    "Change",
    "Checkpointing",
    "Curve",
    "DataSpec",
    "DeviceInfo",
    "DeviceKind",
    "ExportError",
    "JobFacts",
    "LaunchError",
    "LengthStats",
    "ModelConfigError",
    "ModelNotFoundError",
    "ModelSpec",
    "NoFitError",
    "Objective",
    "Outcome",
    "ParameterCount",
    "Parity",
    "ParityPlan",
    "ParityState",
    "Precision",
    "SamplerName",
    "Schedule",
    "SearchSpace",
    "SearchSpec",
    "SpeedRatio",
    "StepStats",
    "StudyError",
    "Task",
    "Terminated",
    "TrialConfig",
    "TrialFilesError",
    "TrialRecord",
    "TrialResult",
    "UsageError",
    "Verdict",
    "batch_choices",
    "changes",
    "check_study_name",
    "claim_folder",
    "classify_exit",
    "combine",
    "default_storage",
    "default_study_name",
    "derive_space",
    "failure_line",
    "format_duration",
    "format_size",
    "is_out_of_memory",
    "judge",
    "loss_outcome",
    "measuring_environment",
    "needs_twin",
    "parse_duration",
    "parse_size",
    "pooled",
    "quiet_step_s",
    "raise_terminated",
    "seed_candidates",
    "speed_ratio",
    "study_folder",
    "supported_precisions",
    "tolerance",
    "values",
    "write_atomic",
]
