"""The probe's training runs, under its timer: the worst-case run (every batch at the
longest length) that gives the peak and the speed, and the run on the user's real
batches (`--dataset`). Both run the real `transformers.Trainer` with the candidate's
arguments plus the probe's bookkeeping fields (`probe_only_arguments`, which the parity
runs share)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from autotune.core.enums import DeviceKind, Outcome
from autotune.core.outcomes import loss_outcome
from autotune.core.parity import PARITY_LR
from autotune.core.schedule import Schedule
from autotune.core.stats import StepStats
from autotune.core.trial import Candidate, TrialResult
from autotune.hf.job import longest_samples
from autotune.probe import device as hardware
from autotune.probe import subnormals
from autotune.probe._inputs import Measurement, Site, TheirData, Workload
from autotune.probe.job import factory_trainer

# Deferred imports: torch, transformers and datasets load in the probe, once `prepare_environment`
# has chosen its GPU and Arrow's memory pool; the search imports this module without them

MAX_STEPS_BY_TIME = 500  # a time-based window never runs longer than this
CPU_WINDOW_S = 1.0  # a search's CPU probe times fast steps for at least a second...
CPU_WINDOW_STEPS = 20  # ... or this many of them (core/schedule.py)


def worst_case(
    work: Workload,
    plan: Measurement,
    data: TheirData,
    site: Site,
    model: Any,
    phases: dict[str, float],
    baseline: dict[str, Any],
) -> tuple[TrialResult, Any]:
    """Warm-up + measured optimizer steps on worst-case batches: the peak and the speed.
    Returns the result and the model trained (the factory's, for a user's job); what the
    job holds before its first step goes into `baseline` (kept by an out-of-memory)."""
    from autotune.probe.timing import StepTimer

    by_time = plan.min_window_s > 0
    schedule = schedule_of(plan, work.processes)
    measured = schedule.longest if schedule else plan.measure_steps
    steps = plan.warmup_steps + (MAX_STEPS_BY_TIME if by_time else measured)
    timer = StepTimer(
        device_kind=site.kind,
        warmup_steps=plan.warmup_steps,
        measure_steps=plan.measure_steps,
        min_window_s=plan.min_window_s,
        schedule=schedule,
    )
    fields = {**work.recipe, **probe_only_arguments(work.recipe, work.seed, site.trial_dir, steps)}
    if data.own_batches:  # a user's job: their batches are timed after the worst case
        trainer, own = on_longest(work, fields, [timer], steps)
    else:
        trainer = worst_case_trainer(work, fields, model, [timer], steps)
    refuse_dropped_fsdp(fields, trainer)
    timer.attach(trainer)
    losses = StepLosses(trainer, work.candidate.gradient_accumulation_steps)
    setup = hardware.setup_bytes(site.kind, site.index, baseline, trainer.model)
    if setup is not None:
        baseline["setup_bytes"] = setup
    tick = time.perf_counter()
    timer.train_starts()
    output = trainer.train()
    ended = time.perf_counter()
    phases["train"] = ended - tick
    model = trainer.model
    result = _measured(work, timer, float(output.training_loss))
    result = result.replace(step_losses=losses.per_step())
    if result.step_time_median_s is None:
        return result, model
    # Setup, compilation and slow first steps: all the warm-up cost beyond steady steps
    result = result.replace(
        one_time_s=round(timer.one_time_s(ended), 3),
        warmup_steps=timer.warmup_steps,
        measure_stop=timer.stop_reason,
    )
    if site.kind == DeviceKind.CPU and result.outcome == Outcome.OK:
        result = with_subnormals(result, trainer, site.first, phases)
    if data.own_batches and result.outcome == Outcome.OK:
        trainer.remove_callback(timer)
        measure_steps, sample_tokens = plan.measure_steps, data.sample_tokens
        result = own_batches(work, measure_steps, sample_tokens, site, trainer, own, result)
    return result, model


def with_subnormals(
    result: TrialResult, trainer: Any, timed: bool, phases: dict[str, float]
) -> TrialResult:
    """The share of the trained optimizer's state that is subnormal, and where it counts
    and `timed`, what this CPU pays for such numbers (probe/subnormals.py): outside the
    timed steps. A reading on the side: whatever it meets (an optimizer of another shape,
    an allocation refused under the memory limit), the probe's result stands without it."""
    tick = time.perf_counter()
    try:
        share, slowdown = subnormals.in_optimizer(trainer, timed)
    except Exception:  # the advice is lost, never the measured run
        share, slowdown = None, None
    phases["subnormals"] = time.perf_counter() - tick
    return result.replace(subnormal_share=share, subnormal_slowdown=slowdown)


def refuse_dropped_fsdp(fields: dict[str, Any], trainer: Any) -> None:
    """A run asked for FSDP that accelerate runs as plain DDP (it keeps the plugin only
    on GPU backends: on the CPU `use_cpu` drops it without a word) would time DDP under
    FSDP's name: an error of the probe, never a measurement."""
    if fields.get("fsdp") and not getattr(trainer, "is_fsdp_enabled", False):
        raise RuntimeError(
            "the arguments ask for FSDP but accelerate runs plain DDP on this device "
            "(FSDP runs on GPUs only): drop fsdp from --base-args here"
        )


class StepLosses:
    """Each optimizer step's training loss, as the Trainer sums it (its micro-batches'
    losses, already scaled for accumulation), kept on the device and read once after
    training: no host sync inside the timed window. Every probe of a study trains from
    the same weights on the same batches in the same order, so these are its parity
    evidence (core/parity.judge_probes)."""

    def __init__(self, trainer: Any, accumulation: int) -> None:
        self.micro: list[Any] = []
        self.accumulation = max(1, accumulation)
        step = trainer.training_step

        def recorded(*args: Any, **kwargs: Any) -> Any:
            loss = step(*args, **kwargs)
            self.micro.append(loss.detach())
            return loss

        trainer.training_step = recorded

    def per_step(self) -> tuple[float, ...]:
        import torch

        if not self.micro:
            return ()
        values = torch.stack([t.float().reshape(()) for t in self.micro]).cpu().tolist()
        whole = len(values) // self.accumulation * self.accumulation
        a = self.accumulation
        return tuple(round(sum(values[i : i + a]), 6) for i in range(0, whole, a))


def worst_case_trainer(
    work: Workload, fields: dict[str, Any], model: Any, callbacks: list[Any], steps: int
) -> Any:
    """A Trainer with `fields` whose every batch is a worst case for `steps` steps: the
    user's job (their factory's) on their longest samples, or the stand-in `model` on
    synthetic sequences at the longest length."""
    from autotune.probe.data import WorstCaseDataset

    if work.model.trainer:
        return on_longest(work, fields, callbacks, steps)[0]
    dataset = WorstCaseDataset.of(work, steps * work.global_batch_size)
    return plain_trainer(fields, model, dataset, _packed(work.candidate), callbacks)


def on_longest(
    work: Workload, fields: dict[str, Any], callbacks: list[Any], steps: int
) -> tuple[Any, Any]:
    """The user's Trainer set to train `steps` steps on their longest samples (the
    survey's), and the train dataset their factory gave it. Packed, the rows are the
    Trainer's own (the survey's indices are of the samples): the fullest rows."""
    trainer = factory_trainer(work.model, work.seed, fields, callbacks)
    theirs = trainer.train_dataset
    known = () if work.candidate.levers.changes_samples else work.longest_samples
    trainer.train_dataset = longest_samples(
        theirs, steps * work.global_batch_size, work.global_batch_size, known
    )
    return trainer, theirs


def own_batches(
    work: Workload,
    measure_steps: int,
    sample_tokens: float,
    site: Site,
    trainer: Any,
    dataset: Any,
    worst: TrialResult,
) -> TrialResult:
    """Time the user's own batches, in their order, on the Trainer the worst case trained
    (the same model and optimizer: no second copy raises the peak). For a user's job
    whose padding is searched: the longest samples have little padding to drop, their
    batches do. One warm-up step and the measured steps; samples/s, real (non-pad)
    tokens/s and the step times become those of their batches."""
    from autotune.probe.data import TokenCount
    from autotune.probe.timing import StepTimer

    steps = 1 + measure_steps
    timer = StepTimer(device_kind=site.kind, warmup_steps=1)
    trainer.add_callback(timer)
    trainer.train_dataset = dataset
    trainer.args.max_steps = steps
    trainer.args.output_dir = str(Path(site.trial_dir) / "trainer-own")
    count = TokenCount(work.model.task)
    hook = trainer.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        trainer.train()
    finally:
        hook.remove()
    return timed_batches(work, measure_steps, sample_tokens, timer, count, worst)


def plain_trainer(
    fields: dict[str, Any], model: Any, dataset: Any, collator: Any, callbacks: list[Any]
) -> Any:
    """A plain `Trainer` around the stand-in model (no factory): the recipe's fields."""
    from transformers import Trainer, TrainingArguments

    return Trainer(
        model=model,
        args=TrainingArguments(**fields),
        train_dataset=dataset,
        callbacks=callbacks,
        data_collator=collator,
    )


def schedule_of(plan: Measurement, processes: int) -> Schedule | None:
    """Adaptive warm-up and measurement, where asked and step ends are host times. Not
    for DDP (`processes` > 1): each rank would decide on its own step times, and a rank
    stopping before the others would leave them waiting in a collective."""
    if not plan.adaptive or plan.min_window_s > 0 or processes > 1:
        return None
    return Schedule(
        max_warmup=plan.warmup_steps,
        max_measure=plan.measure_steps,
        min_measure=min(3, plan.measure_steps),
        incumbent_s=plan.incumbent_s,
        train_steps=plan.train_steps,
        min_window_s=CPU_WINDOW_S,
        most=CPU_WINDOW_STEPS,
    )


def _packed(candidate: Candidate) -> Any:
    """The padding-free collator when the candidate asks for it, else None (Trainer's)."""
    if not candidate.levers.flattens_batches:
        return None
    from autotune.probe.data import PackedBatches

    return PackedBatches(flash_attention=candidate.flash_attention)


def real_batches(
    work: Workload,
    measure_steps: int,
    data: TheirData,
    site: Site,
    model: Any,
    worst: TrialResult,
) -> TrialResult:
    """Time real batches of the user's data, in the candidate's sampling order.

    After the worst-case steps (which set the peak memory), one warm-up step and the
    measured steps run on the tokenized data; samples/s, real (non-pad) tokens/s and
    the step times become those of real batches."""
    from datasets import load_from_disk

    from autotune.probe.data import RealBatches, TokenCount
    from autotune.probe.timing import StepTimer

    steps = 1 + measure_steps
    probe_args = probe_only_arguments(work.recipe, work.seed, site.trial_dir, steps)
    probe_args["output_dir"] = str(Path(site.trial_dir) / "trainer-real")
    collator = _packed(work.candidate) or RealBatches(
        task=work.model.task, pad_token_id=data.pad_token_id
    )
    timer = StepTimer(device_kind=site.kind, warmup_steps=1)
    trainer = plain_trainer(
        {**work.recipe, **probe_args}, model, load_from_disk(data.path), collator, [timer]
    )
    count = TokenCount(work.model.task)
    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        trainer.train()
    finally:
        hook.remove()
    del trainer
    return timed_batches(work, measure_steps, data.sample_tokens, timer, count, worst)


def timed_batches(
    work: Workload,
    measure_steps: int,
    sample_tokens: float,
    timer: Any,
    count: Any,
    worst: TrialResult,
) -> TrialResult:
    """The worst case's result with the speed of the real batches `timer` timed and
    `count` counted (their step times, real tokens and padding) over `measure_steps`
    steps; packed rows count in samples of the data's mean length, `sample_tokens`."""
    times = timer.measured_step_times()
    if not times:
        return worst.replace(outcome=Outcome.ERROR, reason="no real batch step completed")
    accumulation = work.candidate.gradient_accumulation_steps
    window = count.fed()[accumulation : accumulation * (1 + measure_steps)]
    real, fed = sum(r for r, _ in window), sum(f for _, f in window)
    trained, worst_speed = None, worst.samples_per_s
    if work.candidate.levers.changes_samples and sample_tokens > 0:
        steps = [
            sum(r for r, _ in window[i : i + accumulation]) * work.processes
            for i in range(0, len(times) * accumulation, accumulation)
        ]
        times = per_global_batch(times, steps, work.global_batch_size * sample_tokens)
        counted = [n for n in steps if n] or [0]
        trained = round(sum(counted) / len(counted) / sample_tokens, 2)
        if worst_speed:  # full rows a second, counted in samples like the steps
            worst_speed *= work.tokens_per_sample / sample_tokens
    stats = StepStats.of(times)
    return worst.replace(
        samples_per_s=work.global_batch_size / stats.median_s,
        tokens_per_s=real * work.processes / sum(timer.measured_step_times()),
        step_time_median_s=stats.median_s,
        step_time_spread=stats.spread,
        step_time_quiet_s=stats.median_s,  # a step's time depends on its batch: the median ranks
        step_times_s=tuple(round(t, 6) for t in times),
        worst_case_samples_per_s=worst_speed,
        padding_fraction=round(1 - real / fed, 4) if fed else None,
        samples_per_step=trained,
    )


def per_global_batch(times: list[float], tokens: list[int], batch_tokens: float) -> list[float]:
    """Packed steps' times as the time of a step of the global batch's samples at their
    mean length (`batch_tokens`): each step's time scaled by the tokens it trained. A
    packed row holds several samples, so its raw step trains more of them than the
    recipe's: compared per token, its step times rank with the others'."""
    return [t * batch_tokens / n if n else t for t, n in zip(times, tokens, strict=False)]


def probe_only_arguments(
    recipe: dict[str, Any], seed: int, trial_dir: str, total_steps: int
) -> dict[str, Any]:
    """Fields that set run length and bookkeeping only; they do not change the recipe's
    speed or memory. The learning rate (the recipe's, else PARITY_LR) is held constant:
    a schedule meant for thousands of steps would stall a probe's steps, whose losses are
    its parity evidence, and a parity run's."""
    rate = recipe.get("learning_rate")
    return {
        "learning_rate": rate if isinstance(rate, (int, float)) and rate > 0 else PARITY_LR,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "output_dir": str(Path(trial_dir) / "trainer"),
        "max_steps": total_steps,
        "save_strategy": "no",
        "report_to": "none",
        "logging_strategy": "steps",
        "logging_steps": total_steps,  # one log at the end: no extra sync inside the window
        "logging_nan_inf_filter": False,  # a NaN loss must reach training_loss, not be hidden
        "disable_tqdm": True,
        "seed": seed,
    }


def _measured(work: Workload, timer: Any, final_loss: float) -> TrialResult:
    times = timer.measured_step_times()
    if not times:
        return TrialResult(Outcome.ERROR, reason="no measured step completed")
    stats = StepStats.of(times)
    samples_per_s = work.global_batch_size / stats.median_s
    outcome, reason = loss_outcome(final_loss, timer.skipped_in_window)
    return TrialResult(
        outcome=outcome,
        reason=reason,
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * work.tokens_per_sample,
        step_time_median_s=stats.median_s,
        step_time_spread=stats.spread,
        step_time_quiet_s=stats.quiet_s,
        step_times_s=tuple(round(t, 6) for t in times),
        final_loss=final_loss,
        loss_finite=math.isfinite(final_loss),
        skipped_steps=timer.skipped_in_window,
    )
