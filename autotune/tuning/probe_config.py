"""What a probe is told: the `TrialConfig` of one candidate of a study, built from the
study's spec alone (the search's explore probes, parity runs, confirmations and
rehearsals all build theirs here)."""

from __future__ import annotations

from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialConfig
from autotune.hf.training_args import recipe
from autotune.system import devices as device


def probe_config(
    spec: SearchSpec,
    number: int,
    candidate: Candidate,
    *,
    trial_dir: str,
    concurrent: int,
    measure_steps: int = 0,
    adaptive: bool = False,
    incumbent_s: float | None = None,
) -> TrialConfig:
    """The config of trial `number` probing `candidate`, its files in `trial_dir`;
    `measure_steps` 0: the spec's; `concurrent`: probes sharing the machine's cores."""
    torch_device, visible = device.placement(spec.device, spec.nproc_per_node)
    return TrialConfig(
        number=number,
        trial_dir=trial_dir,
        model=spec.model,
        candidate=candidate,
        device=torch_device,
        visible_devices=visible,
        min_measure_s=device.min_window_s(spec.device.kind),
        seq_len=spec.trained_len(candidate),
        target_len=spec.target_len,
        memory_limit_bytes=spec.fit_limit_bytes,
        warmup_steps=spec.warmup_steps,
        measure_steps=measure_steps or spec.measure_steps,
        seed=spec.seed,
        training_arguments=recipe(spec, candidate),
        concurrent=concurrent,
        nproc_per_node=spec.nproc_per_node,
        nnodes=spec.nnodes,
        data_path=spec.data.path if spec.data else "",
        own_batches=spec.own_batches,
        longest_samples=spec.longest_samples,
        sample_tokens=spec.sample_tokens if candidate.levers.changes_samples else 0.0,
        pad_token_id=spec.data.pad_token_id if spec.data else 0,
        adaptive=adaptive,
        incumbent_s=incumbent_s,
        train_steps=spec.train_steps,
    )
