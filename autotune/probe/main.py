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
import os
import shutil
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from autotune.core.enums import DeviceKind, Outcome, Precision
from autotune.core.files import write_atomic
from autotune.core.outcomes import is_out_of_memory
from autotune.core.trial import TrialConfig, TrialResult
from autotune.hf.factory import load_factory
from autotune.hf.levers import attention_kernel
from autotune.hf.models import build_model
from autotune.hf.sharding import deepspeed_stage
from autotune.hf.training_args import checkpointing_field, tuned_arguments
from autotune.probe import device as hardware
from autotune.probe import shared_model
from autotune.probe._train import probe_only_arguments, real_batches, worst_case
from autotune.probe.flops import flops_per_sample, measure_peak_flops
from autotune.probe.ranks import RESULT_NAME, rank_result_name
from autotune.system.process import die_with_parent

# Deferred imports: torch, transformers and DeepSpeed load once `prepare_environment` has chosen
# the probe's GPU and Arrow's memory pool; the search imports this module without them


def run_probe(config: TrialConfig) -> TrialResult:
    """Run the trial and return what it measured; an OOM or crash becomes a typed result."""
    started = time.perf_counter()
    index = int(os.environ.get("LOCAL_RANK", config.device_index))  # a DDP rank: its GPU
    phases: dict[str, float] = {}
    # what the process held before training; kept by an out-of-memory too, whose context
    # tells the memory predictor what the next probe's process will take
    baseline: dict[str, Any] = {}
    try:
        result = _train(config, index, phases, baseline)
    except BaseException as exc:  # classify every failure; KeyboardInterrupt re-raised
        if isinstance(exc, KeyboardInterrupt):
            raise
        result = _failure(exc, config).replace(baseline=dict(baseline))
    gc.collect()
    try:
        versions = hardware.describe_environment(config.device_kind, index)
    except Exception as exc:  # e.g. a CUDA error after a crash: keep the result anyway
        versions = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    versions["world_size"] = os.environ.get("WORLD_SIZE", "1")
    phases["total"] = time.perf_counter() - started
    try:
        peak: int | None = hardware.peak_memory_bytes(config.device_kind, index)
    except Exception:  # a CUDA error after a crash: the typed result still counts
        peak = None
    return result.replace(
        memory_limit_bytes=hardware.limit_in_force(config.device_kind),
        peak_memory_bytes=peak if peak is not None else result.peak_memory_bytes,
        phases_s={k: round(v, 3) for k, v in phases.items()} | _warmup_split(result, phases),
        versions=versions,
        concurrent=config.concurrent,
    )


def _train(
    config: TrialConfig, index: int, phases: dict[str, float], baseline: dict[str, Any]
) -> TrialResult:
    tick = time.perf_counter()
    import transformers.trainer  # noqa: F401 - the heaviest import, before the baseline

    if config.model.trainer:  # the user's module and its imports (peft, trl) likewise
        load_factory(config.model.trainer)
    phases["import"] = time.perf_counter() - tick
    if config.device_kind == DeviceKind.CPU:  # before the limit: kept by an OOM at it
        baseline.update(hardware.baseline(config.device_kind, index))
    if config.memory_limit_bytes is not None:  # after the imports (limit_data_segment)
        hardware.enforce_memory_limit(config.device_kind, index, config.memory_limit_bytes)
    recipe = _recipe(config)
    zero_init = _zero_init(config, recipe)  # alive while the model is built
    model = _model(config, index, phases, baseline)
    del zero_init
    if config.rehearsal:
        from autotune.probe._rehearse import rehearse

        tick = time.perf_counter()
        result = rehearse(config, model, recipe, index)
        phases["train"] = time.perf_counter() - tick
        return result.replace(baseline=dict(baseline))
    if config.parity_steps:
        from autotune.probe._parity import parity_run

        tick = time.perf_counter()
        result = parity_run(config, model, recipe)
        phases["train"] = time.perf_counter() - tick
        return result.replace(baseline=dict(baseline))
    result, model = worst_case(config, model, recipe, phases, baseline, index)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT
    result = result.replace(baseline=dict(baseline), attention=attention_kernel(base))
    per_sample = flops_per_sample(base, config.model.task, config.seq_len, config.target_len)
    if config.data_path and result.outcome == Outcome.OK:
        gc.collect()
        tick = time.perf_counter()
        result = real_batches(config, model, recipe, result)
        phases["real_batches"] = time.perf_counter() - tick
    del model
    if result.samples_per_s is None:
        return result
    tick = time.perf_counter()
    peak = peak_flops(config)
    phases["peak_flops"] = time.perf_counter() - tick
    achieved = per_sample * result.samples_per_s
    if result.worst_case_samples_per_s is not None:  # real batches: FLOPs of real tokens
        achieved = per_sample / config.tokens_per_sample * (result.tokens_per_s or 0.0)
    return result.replace(model_flops_per_s=achieved, peak_flops_per_s=peak)


def peak_flops(config: TrialConfig) -> float | None:
    """The peak a probe's MFU is taken against: a matrix multiply in the precision the
    candidate trains in, on its device. None for as-loaded, which computes in the dtype
    the job holds its weights in (unknown here): no peak rather than one of another
    precision, an MFU that is not true."""

    if config.candidate.precision == Precision.AS_LOADED:
        return None
    return measure_peak_flops(config.device_kind, config.candidate.precision)


def _model(
    config: TrialConfig, index: int, phases: dict[str, float], baseline: dict[str, Any]
) -> Any:
    """The stand-in model: inherited from the fork server, or built here; None for the
    user's job, whose factory builds its own inside the probe's run."""
    from transformers import set_seed

    inherited = shared_model.take(config)  # built once by the fork server (#15)
    if config.model.trainer:
        if config.device_kind != DeviceKind.CPU:
            baseline.update(hardware.baseline(config.device_kind, index))
        return None
    if inherited is not None:
        model, measured = inherited
        if config.device_kind != "cpu":  # the context: this process's own
            measured = hardware.baseline(config.device_kind, index)
        baseline.update(measured, model="inherited from the fork server")
        phases["build"] = 0.0
        return model
    if config.device_kind != DeviceKind.CPU:  # the context, created by the cap
        baseline.update(hardware.baseline(config.device_kind, index))
    tick = time.perf_counter()
    set_seed(config.seed)
    model = build_model(config.model, **config.candidate.model_arguments())
    phases["build"] = time.perf_counter() - tick
    return model


def _recipe(config: TrialConfig) -> dict[str, Any]:
    """The TrainingArguments fields the trial runs with (what export writes)."""
    if config.training_arguments:
        return dict(config.training_arguments)

    return tuned_arguments(
        config.candidate, device_kind=config.device_kind, checkpointing_field=checkpointing_field()
    )


def _zero_init(config: TrialConfig, recipe: dict[str, Any]) -> Any:
    """Under ZeRO-3 the user's from_pretrained builds each process's shard of the weights,
    never the whole model (transformers does so while a TrainingArguments with the config
    is alive): the probe builds its model the same way, so its peak is the user's."""

    if deepspeed_stage(recipe) != 3:
        return None
    import deepspeed
    from transformers import TrainingArguments

    args = TrainingArguments(**{**recipe, **probe_only_arguments(config, 1)})
    deepspeed.init_distributed()  # over the group args started: zero.Init counts its ranks
    return args


def _warmup_split(result: TrialResult, phases: dict[str, float]) -> dict[str, float]:
    """Split the train phase into warm-up and measured steps, for the overhead breakdown."""
    if "train" not in phases or not result.step_times_s:
        return {}
    measured = sum(result.step_times_s)
    return {"measured_steps": round(measured, 3), "warmup": round(phases["train"] - measured, 3)}


def _failure(exc: BaseException, config: TrialConfig) -> TrialResult:
    try:
        in_use: int | None = hardware.memory_in_use(config.device_kind)
    except Exception:  # the device itself failed: no figure, the exception still classifies
        in_use = None
    oom = is_out_of_memory(
        exc,
        limit_bytes=config.memory_limit_bytes,
        in_use_bytes=in_use,
        device_kind=config.device_kind,
    )
    message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
    if oom:
        return TrialResult(Outcome.OOM, reason="out of memory", error=message)
    traceback.print_exception(exc)
    return TrialResult(Outcome.ERROR, reason=message[:120], error=message)


def prepare_environment(config: TrialConfig) -> None:
    """Before torch touches a device or an import reserves memory: the one GPU this probe
    sees, and no import-time memory pool (pyarrow's mimalloc reserves ~1 GiB of address
    space that RLIMIT_DATA would count against the budget)."""
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    for name in [n for n in os.environ if n.startswith("ACCELERATE_DYNAMO_")]:
        del os.environ[name]  # would compile behind the candidate's back
    for name in ("ACCELERATE_USE_CPU", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP"):
        os.environ.pop(name, None)  # the recipe says; ACCELERATE_USE_CPU drops DeepSpeed
    if config.candidate.compiles:  # a cold compile, as the user's first run pays it
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(config.trial_dir) / "inductor-cache")
    if config.visible_devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = config.visible_devices
    if "deepspeed" in config.training_arguments and "WORLD_SIZE" not in os.environ:
        _single_process_group()  # DeepSpeed starts a process group even for one process


def _single_process_group() -> None:
    """The environment torchrun gives a world of one, on a free local port."""

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m autotune.probe TRIAL_DIR/config.json", file=sys.stderr)
        return 2
    config_path = Path(argv[0])
    agent = os.getppid()  # torchrun's agent, for a DDP rank
    try:
        config = TrialConfig.from_json(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
        # run by hand on a file a crash truncated or something else wrote: say which
        print(
            f"error: {config_path} is not a trial's config.json ({type(exc).__name__}: "
            f"{str(exc)[:120]}); rerun the search, which writes each trial's config afresh",
            file=sys.stderr,
        )
        return 2
    prepare_environment(config)
    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if ddp:  # torchrun starts ranks in sessions of their own: die with the agent
        die_with_parent(agent)
    try:
        result = run_probe(config)
    finally:  # the compile cache is the probe's scratch, not the study's record
        shutil.rmtree(Path(config.trial_dir) / "inductor-cache", ignore_errors=True)
    if not ddp:
        write_atomic(config_path.with_name(RESULT_NAME), result.to_json())
        return 0
    rank = int(os.environ.get("RANK", "0"))
    write_atomic(config_path.with_name(rank_result_name(rank)), result.to_json())
    if result.outcome != Outcome.OK:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # torchrun then stops the other ranks, which wait in a collective
    return 0
