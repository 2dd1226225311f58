"""The names under which a study records things: one place, so no key is spelt twice."""

from __future__ import annotations

import enum


class Attr(enum.StrEnum):
    """User attributes of a trial (optuna-dashboard shows them)."""

    OUTCOME = "outcome"
    REASON = "reason"
    RESULT = "result"  # the TrialResult JSON
    CONFIRMS = "confirms"  # on a confirmation run: the number of the trial it confirms
    ROUND = "round"  # on a confirmation run: the interleaved round it was made in
    REUSED = "reused_from"  # figures taken over from another study: not a probe
    CLAIM = "claim"  # the config a running trial probes (see coordination.claim_key)
    FIRST_GUESS = "first_guess"  # queued before any probe: core.space.seed_candidates
    HOST = "host"
    PID = "pid"
    WORKER = "worker"  # a random id per searching process: unique across containers
    TRIAL_DIR = "trial_dir"  # the probe's folder: config.json, result.json, logs
    TRAINING_ARGUMENTS = "training_arguments"
    ACCUMULATION = "gradient_accumulation_steps"
    SAMPLES_PER_S = "samples_per_s"
    TOKENS_PER_S = "tokens_per_s"
    STEP_TIME_MEDIAN_S = "step_time_median_s"
    STEP_TIME_SPREAD_PCT = "step_time_spread_pct"
    PEAK_MEMORY_GIB = "peak_memory_gib"
    BUDGET_USED_PCT = "budget_used_pct"
    CONSTRAINT_GIB = "constraint_gib"


class StudyAttr(enum.StrEnum):
    """User attributes of the study."""

    SPEC = "autotune_spec"
    IDENTITY = "autotune_identity"
    DESCRIPTION = "description"
    REHEARSALS = "autotune_rehearsals"  # core.rehearsal.Rehearsal by trial number
    REHEARSE = "autotune_rehearse"  # false: the last search ran with --no-rehearse
    PARITY = "autotune_parity"  # core.parity.ParityState: the reference, runs, verdicts
    PARITY_PLAN = "autotune_parity_plan"  # tuning.time_plan.ParityPlan: --parity auto's
    OBJECTIVE = "autotune_objective"  # the last search's --objective: what review selects by


CONSTRAINT_NAME = "peak_over_limit_gib"
METRIC_NAMES = ("samples_per_s", "peak_memory_gib")
