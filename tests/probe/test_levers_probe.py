"""A probe with each lever runs on this CPU, or is refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY_GPT2

from autotune.core.trial import Candidate, ModelSpec, Outcome, TrialConfig
from autotune.launch.runner import run_trial

pytestmark = pytest.mark.slow
GPT2 = ModelSpec("gpt2", "local", "causal-lm", TINY_GPT2)


def trial(tmp_path: Path, name: str, candidate: Candidate, **kw: object) -> TrialConfig:
    args: dict[str, object] = dict(
        number=0,
        trial_dir=str(tmp_path / name),
        model=GPT2,
        candidate=candidate,
        device="cpu",
        seq_len=64,
        target_len=0,
        memory_limit_bytes=None,
        warmup_steps=2,
        measure_steps=3,
    )
    args.update(kw)
    return TrialConfig(**args)  # type: ignore[arg-type]


def plain(**levers: object) -> Candidate:
    return Candidate(8, 1, "fp32", False, "adamw_torch", **levers)  # type: ignore[arg-type]


def test_a_compiled_probe_pays_its_compilation_once_and_says_so(tmp_path: Path) -> None:
    eager = run_trial(trial(tmp_path, "eager", plain()), timeout_s=300)
    compiled = run_trial(trial(tmp_path, "compiled", plain(torch_compile=True)), timeout_s=600)
    assert eager.outcome == compiled.outcome == Outcome.OK, compiled.reason
    assert compiled.one_time_s is not None and eager.one_time_s is not None
    # a cold compilation (its own cache) costs seconds; the warm-up excess of a plain run
    # is a fraction of that (0.2-0.4 s alone here, 1.2 s beside two other test runs)
    assert compiled.one_time_s > max(5.0, 4 * eager.one_time_s), (
        compiled.one_time_s,
        eager.one_time_s,
    )
    # the steady steps exclude it: within a few times the eager step, not seconds
    assert compiled.step_time_median_s < 5 * (eager.step_time_median_s or 0)
    assert not (tmp_path / "compiled" / "inductor-cache").exists()  # scratch removed


def test_the_attention_implementation_asked_for_is_the_one_that_ran(tmp_path: Path) -> None:
    for attention in ("eager", "sdpa"):
        result = run_trial(
            trial(tmp_path, attention, plain(attn_implementation=attention)), timeout_s=300
        )
        assert result.outcome == Outcome.OK, result.reason
        assert result.attention == attention


def test_liger_kernels_are_refused_here_with_the_reason(tmp_path: Path) -> None:
    """Never offered on this CPU (the package is absent); forced, the probe says why."""
    result = run_trial(trial(tmp_path, "liger", plain(use_liger_kernel=True)), timeout_s=300)
    assert result.outcome == Outcome.ERROR
    assert "liger" in result.reason.lower()


@pytest.fixture
def lines(tmp_path: Path) -> Path:
    """Tokenized 'data' of varied lengths, as `prepare` saves it."""
    import random

    from datasets import Dataset

    rng = random.Random(0)
    rows = [[rng.randrange(5, 500) for _ in range(rng.randrange(8, 64))] for _ in range(256)]
    path = tmp_path / "data"
    Dataset.from_dict({"input_ids": rows}).save_to_disk(str(path))
    return path


def test_padding_free_and_loader_workers_run_on_real_batches(tmp_path: Path, lines: Path) -> None:
    padded = run_trial(trial(tmp_path, "padded", plain(), data_path=str(lines)), timeout_s=300)
    packed = run_trial(
        trial(tmp_path, "packed", plain(padding_free=True), data_path=str(lines)), timeout_s=300
    )
    workers = run_trial(
        trial(tmp_path, "workers", plain(dataloader_num_workers=1), data_path=str(lines)),
        timeout_s=300,
    )
    for result in (padded, packed, workers):
        assert result.outcome == Outcome.OK, result.reason
    assert padded.padding_fraction is not None and padded.padding_fraction > 0.1
    assert packed.padding_fraction == 0.0  # every token fed is a real one
    assert packed.tokens_per_s and packed.worst_case_samples_per_s
    # the collator runs in the worker process: the tokens are still counted, and the
    # same batches (same sampling) waste what the main process's collator wasted
    assert workers.tokens_per_s and workers.padding_fraction == padded.padding_fraction


def test_a_run_asked_for_fsdp_that_accelerate_runs_as_ddp_is_an_error(tmp_path: Path) -> None:
    """On the CPU, accelerate keeps no FSDP plugin (under torchrun `use_cpu` runs DDP,
    silently): a probe would time DDP under FSDP's name. The Trainer's own flag says
    which ran."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, GPT2Config, Trainer, TrainingArguments

    from autotune.probe._train import refuse_dropped_fsdp

    with pytest.raises(RuntimeError, match="accelerate runs plain DDP on this device"):
        refuse_dropped_fsdp({"fsdp": True}, SimpleNamespace(is_fsdp_enabled=False))
    refuse_dropped_fsdp({"fsdp": True}, SimpleNamespace(is_fsdp_enabled=True))
    model = AutoModelForCausalLM.from_config(GPT2Config(**TINY_GPT2))
    ddp = Trainer(model=model, args=TrainingArguments(str(tmp_path), use_cpu=True, report_to=[]))
    assert ddp.is_fsdp_enabled is False  # the flag the check reads is the Trainer's own
    refuse_dropped_fsdp({}, ddp)
