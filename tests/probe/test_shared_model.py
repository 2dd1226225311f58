"""The model built once per search (probe/shared_model.py): a probe that inherits it from
the fork server measures what a fresh process would."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import write_model
from helpers import SPEC

from autotune.core.trial import Candidate, TrialConfig
from autotune.launch.forkserver import ForkServer, model_to_share
from autotune.launch.runner import run_trial
from autotune.probe import shared_model
from autotune.probe.shared_model import SharedModel

# 95M parameters (380 MB in fp32): a second copy would add a sixth to the peak (2.3 GiB,
# mostly the imports, the weights, their gradients and AdamW's state: a batch of 2 x 32
# tokens adds little, and a step takes about a second on one core)
MID_GPT2 = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_embd": 768,
    "n_layer": 8,
    "n_head": 12,
    "n_positions": 128,
    "vocab_size": 50000,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
CANDIDATE = Candidate(2, 1, "fp32", False, "adamw_torch", attn_implementation="sdpa")


def probe_config(
    model_dir: Path, trial_dir: Path, attention: str = "sdpa", seed: int = 0
) -> TrialConfig:
    from autotune.hf.models import resolve_model

    return TrialConfig(
        number=0,
        trial_dir=str(trial_dir),
        model=resolve_model(str(model_dir)),
        candidate=dataclasses.replace(CANDIDATE, attn_implementation=attention),
        device="cpu",
        seq_len=32,
        target_len=8,
        memory_limit_bytes=None,
        warmup_steps=2,
        measure_steps=5,
        seed=seed,
    )


def wanted(config: TrialConfig) -> SharedModel:
    """The model a probe of `config` builds."""
    return SharedModel.of(config.model, config.seed, config.candidate)


@pytest.mark.slow
def test_an_inherited_model_gives_the_peak_and_loss_of_a_fresh_process(
    tmp_path: Path,
) -> None:
    model_dir = write_model(tmp_path / "mid-gpt2", MID_GPT2)
    fresh = run_trial(probe_config(model_dir, tmp_path / "fresh"), timeout_s=300)
    shared = wanted(probe_config(model_dir, tmp_path / "any"))
    server = ForkServer(tmp_path / "forkserver.log", data_limit=None, shared=shared)
    try:
        assert server.shared_model.startswith("built in")
        inherited = run_trial(
            probe_config(model_dir, tmp_path / "inherited"), timeout_s=300, server=server
        )
        # another seed: this probe builds its own model, and lets the inherited copy go
        own = run_trial(
            probe_config(model_dir, tmp_path / "own", seed=1), timeout_s=300, server=server
        )
    finally:
        server.close()
    assert inherited.baseline.get("model") == "inherited from the fork server"
    assert inherited.phases_s["build"] == 0.0 and fresh.phases_s["build"] > 0.0
    assert "model" not in own.baseline and own.phases_s["build"] > 0.0
    for run in (inherited, own):
        assert run.peak_memory_bytes and fresh.peak_memory_bytes
        gap = abs(run.peak_memory_bytes - fresh.peak_memory_bytes) / fresh.peak_memory_bytes
        assert gap < 0.08, (fresh.peak_memory_bytes, run.peak_memory_bytes)
    # the same weights and batches: the same loss
    assert inherited.final_loss == pytest.approx(fresh.final_loss, rel=1e-5)
    # Its speed against a fresh process is a benchmark's question, not a test's: two tests
    # share these two cores, and a step read 1.5-2x slower for whichever probe ran beside
    # another test (ci). `benchmarks/families.py` times the three launches
    # interleaved, alone on the host, and prints each one's quickest step.


def test_a_probe_takes_the_inherited_model_only_when_it_would_build_the_same(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model_dir = write_model(tmp_path / "m", MID_GPT2)
    config = probe_config(model_dir, tmp_path / "t")
    model = object()
    built = {"shared": wanted(config), "model": model, "baseline": {"rss_bytes": 1}}
    others = (
        probe_config(model_dir, tmp_path / "t", seed=1),
        probe_config(model_dir, tmp_path / "t", "eager"),
    )
    for other in others:  # other weights, another kernel
        monkeypatch.setattr(shared_model, "_BUILT", dict(built))
        assert shared_model.take(wanted(other)) is None
        assert "model" not in shared_model._BUILT  # and the copy is let go
    monkeypatch.setattr(shared_model, "_BUILT", dict(built))
    assert shared_model.take(wanted(config)) == (model, {"rss_bytes": 1})
    assert shared_model.take(wanted(config)) is None  # once


def test_the_server_shares_the_model_only_where_its_copy_fits_beside_a_probe() -> None:
    # a 16 GiB machine, an 8 GiB budget: a 1 GiB model's copy fits beside a probe
    small = dataclasses.replace(SPEC, parameters=2**28)
    shared = model_to_share(small)
    assert shared is not None and shared.model == SPEC.model and shared.seed == SPEC.seed
    # the whole machine as the budget: a probe at its limit and a 2 GiB copy do not fit
    whole = dataclasses.replace(small, memory_budget_bytes=16 * 2**30, parameters=2**29)
    assert model_to_share(whole) is None
    assert model_to_share(dataclasses.replace(small, nproc_per_node=2)) is None
    assert SharedModel.from_json(shared.to_json()) == shared
