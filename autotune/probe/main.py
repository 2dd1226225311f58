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

import datetime
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
from autotune.core.nodes import PROCESS_GROUP_S
from autotune.core.outcomes import is_out_of_memory
from autotune.core.trial import Candidate, TrialConfig, TrialResult
from autotune.hf.factory import load_factory
from autotune.hf.levers import attention_kernel
from autotune.hf.models import build_model
from autotune.hf.sharding import deepspeed_stage
from autotune.hf.training_args import checkpointing_field, tuned_arguments
from autotune.probe import device as hardware
from autotune.probe import shared_model
from autotune.probe._inputs import Measurement, Site, TheirData, Workload
from autotune.probe._train import probe_only_arguments, real_batches, worst_case
from autotune.probe.flops import flops_per_sample, measure_peak_flops
from autotune.probe.ranks import RESULT_NAME, rank_result_name
from autotune.system.process import die_with_parent

# Deferred imports: torch, transformers and DeepSpeed load once `prepare_environment` has chosen
# the probe's GPU and Arrow's memory pool; the search imports this module without them


def join_process_group(kind: str) -> None:
    """Across nodes, the ranks meet in a process group whose collectives give up after
    PROCESS_GROUP_S: a peer frozen or gone before the first step fails the run instead
    of holding it for torch's half hour (the Trainer's `ddp_timeout` never reaches the
    CPU's group; accelerate then takes this group as it is)."""
    import torch
    import torch.distributed as dist

    backend = "gloo"
    if kind == DeviceKind.CUDA:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=PROCESS_GROUP_S))


def run_probe(config: TrialConfig) -> TrialResult:
    """Run the trial and return what it measured; an OOM or crash becomes a typed result.
    The config is read here alone: each part of the run takes what it uses of it."""
    started = time.perf_counter()
    index = int(os.environ.get("LOCAL_RANK", config.device_index))  # a DDP rank: its GPU
    site = Site(config.device_kind, index, config.trial_dir, config.node_rank)
    phases: dict[str, float] = {}
    # what the process held before training; kept by an out-of-memory too, whose context
    # tells the memory predictor what the next probe's process will take
    baseline: dict[str, Any] = {}
    data = TheirData(
        config.data_path, config.pad_token_id, config.own_batches, config.sample_tokens
    )
    try:
        _set_up(config.model.trainer, config.memory_limit_bytes, site, phases, baseline)
        work = Workload(
            model=config.model,
            candidate=config.candidate,
            recipe=_recipe(config.training_arguments, config.candidate, site.kind),
            seed=config.seed,
            seq_len=config.seq_len,
            target_len=config.target_len,
            processes=config.nproc_per_node * config.nnodes,
            longest_samples=config.longest_samples,
        )
        model = _model(work, site, phases, baseline)
        if config.rehearsal:
            result = _rehearsal(work, config.rehearsal, site, model, phases)
        elif config.parity_steps:
            result = _parity_run(work, config.parity_steps, data, site, model, phases)
        else:
            plan = Measurement(
                warmup_steps=config.warmup_steps,
                measure_steps=config.measure_steps,
                min_window_s=config.min_measure_s,
                adaptive=config.adaptive,
                incumbent_s=config.incumbent_s,
                train_steps=config.train_steps,
            )
            result = _timed(work, plan, data, site, model, phases, baseline)
    except BaseException as exc:  # classify every failure; KeyboardInterrupt re-raised
        if isinstance(exc, KeyboardInterrupt):
            raise
        result = _failure(exc, site.kind, config.memory_limit_bytes)
    result = result.replace(baseline=dict(baseline))
    return _finished(result, site, phases, started, config.concurrent)


def _finished(
    result: TrialResult, site: Site, phases: dict[str, float], started: float, concurrent: int
) -> TrialResult:
    """The result with what every probe records, whatever its outcome: the environment,
    the peak, the limit in force and the phases' times (`started`: the probe's start)."""
    gc.collect()
    try:
        versions = hardware.describe_environment(site.kind, site.index)
    except Exception as exc:  # e.g. a CUDA error after a crash: keep the result anyway
        versions = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    versions["world_size"] = os.environ.get("WORLD_SIZE", "1")
    phases["total"] = time.perf_counter() - started
    try:
        peak: int | None = hardware.peak_memory_bytes(site.kind, site.index)
    except Exception:  # a CUDA error after a crash: the typed result still counts
        peak = None
    return result.replace(
        memory_limit_bytes=hardware.limit_in_force(site.kind),
        peak_memory_bytes=peak if peak is not None else result.peak_memory_bytes,
        phases_s={k: round(v, 3) for k, v in phases.items()} | _warmup_split(result, phases),
        versions=versions,
        concurrent=concurrent,
    )


def _set_up(
    trainer: str,
    memory_limit_bytes: int | None,
    site: Site,
    phases: dict[str, float],
    baseline: dict[str, Any],
) -> None:
    """The imports (the user's module too, `trainer`), then the memory limit."""
    tick = time.perf_counter()
    import transformers.trainer  # noqa: F401 - the heaviest import, before the baseline

    if trainer:  # the user's module and its imports (peft, trl) likewise
        load_factory(trainer)
    phases["import"] = time.perf_counter() - tick
    if site.kind == DeviceKind.CPU:  # before the limit: kept by an OOM at it
        baseline.update(hardware.baseline(site.kind, site.index))
    if memory_limit_bytes is not None:  # after the imports (limit_data_segment)
        hardware.enforce_memory_limit(site.kind, site.index, memory_limit_bytes)


def _rehearsal(
    work: Workload, plan: dict[str, Any], site: Site, model: Any, phases: dict[str, float]
) -> TrialResult:
    from autotune.probe._rehearse import rehearse

    tick = time.perf_counter()
    result = rehearse(work, plan, site, model)
    phases["train"] = time.perf_counter() - tick
    return result


def _parity_run(
    work: Workload, steps: int, data: TheirData, site: Site, model: Any, phases: dict[str, float]
) -> TrialResult:
    from autotune.probe._parity import parity_run

    tick = time.perf_counter()
    result = parity_run(work, steps, data, site, model)
    phases["train"] = time.perf_counter() - tick
    return result


def _timed(
    work: Workload,
    plan: Measurement,
    data: TheirData,
    site: Site,
    model: Any,
    phases: dict[str, float],
    baseline: dict[str, Any],
) -> TrialResult:
    """The worst case (the peak, the speed), the real batches after it (--dataset), and
    the model FLOPs against the device's peak."""
    result, model = worst_case(work, plan, data, site, model, phases, baseline)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT
    result = result.replace(attention=attention_kernel(base))
    per_sample = flops_per_sample(base, work.model.task, work.seq_len, work.target_len)
    if data.path and result.outcome == Outcome.OK:
        gc.collect()
        tick = time.perf_counter()
        result = real_batches(work, plan.measure_steps, data, site, model, result)
        phases["real_batches"] = time.perf_counter() - tick
    del model
    if result.samples_per_s is None:
        return result
    tick = time.perf_counter()
    peak = peak_flops(work.candidate.precision, site.kind)
    phases["peak_flops"] = time.perf_counter() - tick
    achieved = per_sample * result.samples_per_s
    if result.worst_case_samples_per_s is not None:  # real batches: FLOPs of real tokens
        achieved = per_sample / work.tokens_per_sample * (result.tokens_per_s or 0.0)
    return result.replace(model_flops_per_s=achieved, peak_flops_per_s=peak)


def peak_flops(precision: Precision, device_kind: DeviceKind) -> float | None:
    """The peak a probe's MFU is taken against: a matrix multiply in the `precision` the
    candidate trains in, on its device. None for as-loaded, which computes in the dtype
    the job holds its weights in (unknown here): no peak rather than one of another
    precision, an MFU that is not true."""

    if precision == Precision.AS_LOADED:
        return None
    return measure_peak_flops(device_kind, precision)


def _model(work: Workload, site: Site, phases: dict[str, float], baseline: dict[str, Any]) -> Any:
    """The stand-in model: inherited from the fork server, or built here; None for the
    user's job, whose factory builds its own inside the probe's run. Under ZeRO-3 it is
    built as each process's shard (`_zero_init`)."""
    from transformers import set_seed

    zero_init = _zero_init(work.recipe, work.seed, site.trial_dir)  # alive while it is built
    wanted = shared_model.SharedModel.of(work.model, work.seed, work.candidate)
    inherited = shared_model.take(wanted)  # built once by the fork server (#15)
    if work.model.trainer:
        if site.kind != DeviceKind.CPU:
            baseline.update(hardware.baseline(site.kind, site.index))
        return None
    if inherited is not None:
        model, measured = inherited
        if site.kind != "cpu":  # the context: this process's own
            measured = hardware.baseline(site.kind, site.index)
        baseline.update(measured, model="inherited from the fork server")
        phases["build"] = 0.0
        return model
    if site.kind != DeviceKind.CPU:  # the context, created by the cap
        baseline.update(hardware.baseline(site.kind, site.index))
    tick = time.perf_counter()
    set_seed(work.seed)
    model = build_model(work.model, **work.candidate.model_arguments())
    phases["build"] = time.perf_counter() - tick
    del zero_init
    return model


def _recipe(
    training_arguments: dict[str, Any], candidate: Candidate, device_kind: DeviceKind
) -> dict[str, Any]:
    """The TrainingArguments fields the trial runs with (what export writes): the
    config's, or where it has none the candidate's own."""
    if training_arguments:
        return dict(training_arguments)

    return tuned_arguments(
        candidate, device_kind=device_kind, checkpointing_field=checkpointing_field()
    )


def _zero_init(recipe: dict[str, Any], seed: int, trial_dir: str) -> Any:
    """Under ZeRO-3 the user's from_pretrained builds each process's shard of the weights,
    never the whole model (transformers does so while a TrainingArguments with the config
    is alive): the probe builds its model the same way, so its peak is the user's."""

    if deepspeed_stage(recipe) != 3:
        return None
    import deepspeed
    from transformers import TrainingArguments

    args = TrainingArguments(**{**recipe, **probe_only_arguments(recipe, seed, trial_dir, 1)})
    deepspeed.init_distributed()  # over the group args started: zero.Init counts its ranks
    return args


def _warmup_split(result: TrialResult, phases: dict[str, float]) -> dict[str, float]:
    """Split the train phase into warm-up and measured steps, for the overhead breakdown."""
    if "train" not in phases or not result.step_times_s:
        return {}
    measured = sum(result.step_times_s)
    return {"measured_steps": round(measured, 3), "warmup": round(phases["train"] - measured, 3)}


def _failure(
    exc: BaseException, device_kind: DeviceKind, memory_limit_bytes: int | None
) -> TrialResult:
    try:
        in_use: int | None = hardware.memory_in_use(device_kind)
    except Exception:  # the device itself failed: no figure, the exception still classifies
        in_use = None
    oom = is_out_of_memory(
        exc,
        limit_bytes=memory_limit_bytes,
        in_use_bytes=in_use,
        device_kind=device_kind,
    )
    message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
    if oom:
        return TrialResult(Outcome.OOM, reason="out of memory", error=message)
    traceback.print_exception(exc)
    return TrialResult(Outcome.ERROR, reason=message[:120], error=message)


def prepare_environment(
    *, compiles: bool, trial_dir: str, visible_devices: str, deepspeed: bool
) -> None:
    """Before torch touches a device or an import reserves memory: the one GPU this probe
    sees (`visible_devices`, "": leave it), and no import-time memory pool (pyarrow's
    mimalloc reserves ~1 GiB of address space that RLIMIT_DATA would count against the
    budget). A candidate that `compiles` gets a cold inductor cache in the trial's folder;
    a `deepspeed` run of one process, the process group DeepSpeed starts."""
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    for name in [n for n in os.environ if n.startswith("ACCELERATE_DYNAMO_")]:
        del os.environ[name]  # would compile behind the candidate's back
    for name in ("ACCELERATE_USE_CPU", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP"):
        os.environ.pop(name, None)  # the recipe says; ACCELERATE_USE_CPU drops DeepSpeed
    if compiles:  # a cold compile, as the user's first run pays it
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(trial_dir) / "inductor-cache")
    if visible_devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices
    if deepspeed and "WORLD_SIZE" not in os.environ:
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
    prepare_environment(
        compiles=config.candidate.levers.compiles,
        trial_dir=config.trial_dir,
        visible_devices=config.visible_devices,
        deepspeed="deepspeed" in config.training_arguments,
    )
    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if ddp:  # torchrun starts ranks in sessions of their own: die with the agent
        die_with_parent(agent)
    if ddp and config.nnodes > 1:
        join_process_group(config.device_kind)
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
