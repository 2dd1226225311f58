"""The child: one trial, one process. `python -m autotune.probe CONFIG.json`.

A pure function of config.json: it sets the memory limit, builds the model with
random weights, runs the real `transformers.Trainer` with the candidate's
TrainingArguments for warm-up + measured optimizer steps, and writes result.json
beside the config. Rerun it by hand to reproduce a trial.

Launched by torchrun (a DDP probe), each rank writes result.rank<R>.json and a rank
that fails exits non-zero, so torchrun stops the ranks waiting on it in a collective;
the parent merges the ranks' results (merge_ranks).
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from autotune.probe import device as hardware
from autotune.launch.outcomes import is_out_of_memory, loss_outcome
from autotune.core.trial import Outcome, TrialConfig, TrialResult, write_atomic

RESULT_NAME = "result.json"


def run_probe(config: TrialConfig) -> TrialResult:
    """Run the trial and return what it measured; an OOM or crash becomes a typed result."""
    started = time.perf_counter()
    index = int(config.device.split(":")[1]) if ":" in config.device else 0
    index = int(os.environ.get("LOCAL_RANK", index))  # a DDP rank uses its own GPU
    phases: dict[str, float] = {}
    if config.memory_budget_bytes is not None:
        hardware.enforce_memory_budget(config.device_kind, index, config.memory_budget_bytes)
    try:
        result = _train(config, phases)
    except BaseException as exc:  # classify every failure; KeyboardInterrupt re-raised
        if isinstance(exc, KeyboardInterrupt):
            raise
        result = _failure(exc, config)
    gc.collect()
    try:
        versions = hardware.describe_environment(config.device_kind, index)
    except Exception as exc:  # e.g. a CUDA error after a crash: keep the result anyway
        versions = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    versions["world_size"] = os.environ.get("WORLD_SIZE", "1")
    phases["total"] = time.perf_counter() - started
    return result.replace(
        peak_memory_bytes=hardware.peak_memory_bytes(config.device_kind, index),
        phases_s={k: round(v, 3) for k, v in phases.items()} | _warmup_split(result, phases),
        versions=versions,
        concurrent=config.concurrent,
    )


def _train(config: TrialConfig, phases: dict[str, float]) -> TrialResult:
    tick = time.perf_counter()
    from transformers import Trainer, TrainingArguments, set_seed

    from autotune.probe.data import WorstCaseDataset
    from autotune.probe.flops import flops_per_sample, measure_peak_flops
    from autotune.hf.models import build_model
    from autotune.probe.timing import StepTimer

    phases["import"] = time.perf_counter() - tick
    tick = time.perf_counter()
    set_seed(config.seed)
    model = build_model(config.model)
    phases["build"] = time.perf_counter() - tick
    total_steps = config.warmup_steps + config.measure_steps
    dataset = WorstCaseDataset(
        task=config.model.task,
        length=total_steps * config.global_batch_size,
        seq_len=config.seq_len,
        target_len=config.target_len,
        vocab_size=config.model.vocab_size,
        num_labels=int(config.model.config.get("num_labels", 2)),
        seed=config.seed,
    )
    recipe = {
        **config.base_arguments,
        **config.candidate.training_arguments(device_kind=config.device_kind),
    }
    args = TrainingArguments(**{**recipe, **_probe_only_arguments(config, total_steps)})
    timer = StepTimer(device_kind=config.device_kind, warmup_steps=config.warmup_steps)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=[timer])
    tick = time.perf_counter()
    output = trainer.train()
    phases["train"] = time.perf_counter() - tick
    per_sample = flops_per_sample(model, config.model.task, config.seq_len, config.target_len)
    del trainer
    result = _measured(config, timer, float(output.training_loss))
    if config.data_path and result.outcome == Outcome.OK:
        gc.collect()
        tick = time.perf_counter()
        result = _real_batches(config, model, recipe, result)
        phases["real_batches"] = time.perf_counter() - tick
    del model
    if result.samples_per_s is None:
        return result
    tick = time.perf_counter()
    peak = measure_peak_flops(config.device_kind, config.candidate.precision)
    phases["peak_flops"] = time.perf_counter() - tick
    achieved = per_sample * result.samples_per_s
    if result.worst_case_samples_per_s is not None:  # real batches: FLOPs of real tokens
        achieved = per_sample / config.tokens_per_sample * (result.tokens_per_s or 0.0)
    return result.replace(model_flops_per_s=achieved, peak_flops_per_s=peak)


def _real_batches(
    config: TrialConfig, model: Any, recipe: dict[str, Any], worst: TrialResult
) -> TrialResult:
    """Time real batches of the user's data, in the candidate's sampling order.

    After the worst-case steps (which set the peak memory), one warm-up step and the
    measured steps run on the tokenized data; samples/s, real (non-pad) tokens/s and
    the step times become those of real batches."""
    from datasets import load_from_disk
    from transformers import Trainer, TrainingArguments

    from autotune.probe.data import RealBatches
    from autotune.probe.timing import StepTimer

    steps = 1 + config.measure_steps
    probe_args = _probe_only_arguments(config, steps)
    probe_args["output_dir"] = str(Path(config.trial_dir) / "trainer-real")
    args = TrainingArguments(**{**recipe, **probe_args})
    collator = RealBatches(task=config.model.task, pad_token_id=config.pad_token_id)
    timer = StepTimer(device_kind=config.device_kind, warmup_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=load_from_disk(config.data_path),
                      data_collator=collator, callbacks=[timer])  # fmt: skip
    trainer.train()
    del trainer
    times = timer.measured_step_times()
    if not times:
        return worst.replace(outcome=Outcome.ERROR, reason="no real batch step completed")
    accumulation = config.candidate.gradient_accumulation_steps
    window = collator.fed[accumulation : accumulation * steps]
    real, fed = sum(r for r, _ in window), sum(f for _, f in window)
    median = statistics.median(times)
    quartiles = statistics.quantiles(times, n=4) if len(times) >= 2 else [median] * 3
    return worst.replace(
        samples_per_s=config.global_batch_size / median,
        tokens_per_s=real * config.nproc_per_node / sum(times),
        step_time_median_s=median,
        step_time_spread=(quartiles[2] - quartiles[0]) / median,
        step_times_s=tuple(round(t, 6) for t in times),
        worst_case_samples_per_s=worst.samples_per_s,
        padding_fraction=round(1 - real / fed, 4) if fed else None,
    )


def _probe_only_arguments(config: TrialConfig, total_steps: int) -> dict[str, Any]:
    """Fields that set run length and bookkeeping only; they do not change the recipe."""
    return {
        "output_dir": str(Path(config.trial_dir) / "trainer"),
        "max_steps": total_steps,
        "save_strategy": "no",
        "report_to": "none",
        "logging_strategy": "steps",
        "logging_steps": total_steps,  # one log at the end: no extra sync inside the window
        "logging_nan_inf_filter": False,  # a NaN loss must reach training_loss, not be hidden
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "seed": config.seed,
    }


def _measured(config: TrialConfig, timer: Any, final_loss: float) -> TrialResult:
    times = timer.measured_step_times()
    if not times:
        return TrialResult(Outcome.ERROR, reason="no measured step completed")
    median = statistics.median(times)
    quartiles = statistics.quantiles(times, n=4) if len(times) >= 2 else [median] * 3
    samples_per_s = config.global_batch_size / median
    outcome, reason = loss_outcome(final_loss, timer.skipped_in_window)
    return TrialResult(
        outcome=outcome,
        reason=reason,
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * config.tokens_per_sample,
        step_time_median_s=median,
        step_time_spread=(quartiles[2] - quartiles[0]) / median,
        step_times_s=tuple(round(t, 6) for t in times),
        final_loss=final_loss,
        loss_finite=math.isfinite(final_loss),
        skipped_steps=timer.skipped_in_window,
    )


def _warmup_split(result: TrialResult, phases: dict[str, float]) -> dict[str, float]:
    """Split the train phase into warm-up and measured steps, for the overhead breakdown."""
    if "train" not in phases or not result.step_times_s:
        return {}
    measured = sum(result.step_times_s)
    return {"measured_steps": round(measured, 3), "warmup": round(phases["train"] - measured, 3)}


def _failure(exc: BaseException, config: TrialConfig) -> TrialResult:
    in_use = hardware.memory_in_use(config.device_kind)
    oom = is_out_of_memory(exc, limit_bytes=config.memory_budget_bytes, in_use_bytes=in_use)
    message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
    if oom:
        return TrialResult(Outcome.OOM, reason="out of memory", error=message)
    traceback.print_exception(exc)
    return TrialResult(Outcome.ERROR, reason=message[:120], error=message)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m autotune.probe TRIAL_DIR/config.json", file=sys.stderr)
        return 2
    config_path = Path(argv[0])
    config = TrialConfig.from_json(config_path.read_text(encoding="utf-8"))
    result = run_probe(config)
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        write_atomic(config_path.with_name(RESULT_NAME), result.to_json())
        return 0
    rank = int(os.environ.get("RANK", "0"))
    write_atomic(config_path.with_name(rank_result_name(rank)), result.to_json())
    if result.outcome != Outcome.OK:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # torchrun then stops the other ranks, which wait in a collective
    return 0


def rank_result_name(rank: int) -> str:
    return f"result.rank{rank}.json"


def merge_ranks(trial_dir: Path, world_size: int) -> None:
    """Write result.json from the ranks' results: a failing rank's result wins (an OOM
    before other failures); otherwise rank 0's figures with the highest rank's peak.
    Writes nothing when no rank wrote a result, or when an ok run lacks a rank."""
    results = []
    for rank in range(world_size):
        path = trial_dir / rank_result_name(rank)
        try:
            results.append(TrialResult.from_json(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    failed = sorted(
        (r for r in results if r.outcome != Outcome.OK), key=lambda r: r.outcome != Outcome.OOM
    )
    if failed:
        merged = failed[0]
    elif results and len(results) == world_size:
        merged = results[0]
    else:
        return
    peaks = [r.peak_memory_bytes for r in results if r.peak_memory_bytes is not None]
    merged = merged.replace(peak_memory_bytes=max(peaks) if peaks else None)
    write_atomic(trial_dir / RESULT_NAME, merged.to_json())

