"""The first guesses queued before any probe, against what the probes since have shown."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from helpers import SPEC
from optuna.trial import TrialState

from autotune.core.enums import Outcome
from autotune.core.space import SearchSpace
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialConfig, TrialResult
from autotune.store.keys import Attr
from autotune.store.store import StudyStore
from autotune.tuning._memory_verdict import far_over_budget
from autotune.tuning._skips import open_candidates
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.tuning.run import SearchRun, prepare_store

GIB = 2**30


class OutOfMemory:
    """A launcher whose every probe runs out of memory at the limit, as the allocator
    reports it; it keeps what it was asked to run."""

    def __init__(self) -> None:
        self.ran: list[Candidate] = []

    def run(self, config: TrialConfig, timeout_s: float, **_: object) -> TrialResult:
        self.ran.append(config.candidate)
        return TrialResult(
            Outcome.OOM,
            reason="out of memory",
            error="RuntimeError: DefaultCPUAllocator: can't allocate memory",
            peak_memory_bytes=config.memory_limit_bytes,
        )


class Seen:
    """An observer that keeps the trials it was told of, as the progress output shows them."""

    def __init__(self) -> None:
        self.ended: list[tuple[int, Candidate, TrialResult]] = []

    def on_trial_end(self, number: int, candidate: Candidate, result: TrialResult) -> None:
        self.ended.append((number, candidate, result))

    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: None


def search(
    tmp_path: Path, spec: SearchSpec, launcher: OutOfMemory, observer: Seen | None = None
) -> StudyStore:
    """Queue the first guesses and explore two probes, the model proposing."""
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    store = prepare_store(spec=spec, study_name="first-guess", storage=url, sampler="model")
    limits = SearchLimits(max_trials=2, propose=True, confirm_top=0)
    run = SearchRun(
        store=store,
        study_dir=tmp_path,
        limits=limits,
        observer=observer or Seen(),
        launcher=launcher,
    )  # type: ignore[arg-type]
    run.explore(Deadline.after(None), wait_for_others=False)
    return store


def test_a_queued_first_guess_the_recipes_oom_rules_out_waits_instead_of_running(
    tmp_path: Path,
) -> None:
    """Where memory binds: the recipe (8 fp32) runs out of memory, so the estimate's
    activation term is bounded, and the queued fast guess (32 fp32 fused, four times the
    activations) is deferred, not launched into a certain OOM, and left open; its
    settings are probed next at the largest batch the estimate says fits: 4, as at 8
    fused AdamW holds what the recipe held when it ran out (the same activations; the
    optimizer step does not set the peak), though the recipe's OOM does not rule it out."""
    space = SearchSpace(
        global_batch_size=64,
        micro_batches=(8, 16, 32, 64),
        fallback_batches=(1, 2, 4),
        precisions=("fp32", "bf16"),
        checkpointing=(False, True),
        optimizers=("adamw_torch", "adamw_torch_fused"),
    )
    spec = dataclasses.replace(
        SPEC, space=space, parameters=10_000_000, memory_budget_bytes=2 * GIB
    )
    recipe, fast = (
        space.candidate(8, "fp32", False, "adamw_torch"),
        space.candidate(32, "fp32", False, "adamw_torch_fused"),
    )
    launcher, seen = OutOfMemory(), Seen()
    store = search(tmp_path, spec, launcher, seen)

    assert launcher.ran == [recipe, space.candidate(4, "fp32", False, "adamw_torch_fused")]
    trials = store.study.get_trials(deepcopy=False)
    deferred = [t for t in trials if "first guess deferred" in t.user_attrs.get(Attr.REASON, "")]
    assert len(deferred) == 1 and deferred[0].state == TrialState.PRUNED
    assert deferred[0].params["optim"] == "adamw_torch_fused"
    before = store.records()[:1]  # the deferral ruled nothing out, nor did the recipe's OOM
    eight = space.candidate(8, "fp32", False, "adamw_torch_fused")
    assert {fast, eight} <= set(open_candidates(space, before, far_over_budget(spec, before)))
    # the progress output says why the queued guess did not run
    shown = [(c, r.reason) for _, c, r in seen.ended if r.outcome == Outcome.SKIPPED]
    assert (fast, "first guess deferred: the estimate says it will not fit") in shown


def test_a_first_guess_runs_where_nothing_has_ruled_it_out(tmp_path: Path) -> None:
    """Without a budget that binds, both first guesses are probed, in their order."""
    space = SearchSpace(
        global_batch_size=64,
        micro_batches=(8, 16, 32, 64),
        fallback_batches=(1, 2, 4),
        precisions=("fp32",),
        checkpointing=(False,),
        optimizers=("adamw_torch", "adamw_torch_fused"),
    )
    spec = dataclasses.replace(SPEC, space=space, parameters=10_000)

    class Fits(OutOfMemory):
        def run(self, config: TrialConfig, timeout_s: float, **_: object) -> TrialResult:
            self.ran.append(config.candidate)
            return TrialResult(
                Outcome.OK,
                samples_per_s=10.0,
                step_time_median_s=6.4,
                peak_memory_bytes=GIB // 2,
                step_times_s=(6.4,) * 3,
            )

    launcher = Fits()
    search(tmp_path, spec, launcher)
    assert launcher.ran == [
        space.candidate(8, "fp32", False, "adamw_torch"),
        space.candidate(32, "fp32", False, "adamw_torch_fused"),
    ]


def test_the_users_recipe_is_the_first_probe(tmp_path: Path) -> None:
    """A recipe of theirs is probed before the plain default and the fast guess: every
    change is weighed against it, and a short budget may allow a single probe (a
    1-minute QLoRA search on an H100 probed only the plain default, and exported a
    change of their precision and optimizer)."""
    space = SearchSpace(
        global_batch_size=16,
        micro_batches=(8, 16),
        fallback_batches=(1, 2, 4),
        precisions=("fp32", "bf16"),
        checkpointing=(False,),
        optimizers=("adamw_torch", "adamw_torch_fused", "adafactor"),
    )
    recipe = {"per_device_train_batch_size": 8, "bf16": True, "optim": "adafactor"}
    spec = dataclasses.replace(SPEC, space=space, parameters=10_000, recipe_settings=recipe)
    launcher = OutOfMemory()
    search(tmp_path, spec, launcher)
    assert launcher.ran[0] == space.candidate(8, "bf16", False, "adafactor")
