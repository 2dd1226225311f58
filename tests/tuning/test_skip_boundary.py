"""The skip rule on a real OOM boundary: it never skips a config that would have fit."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TinyBudgets

from autotune.core.space import SearchSpace
from autotune.core.trial import Outcome, TrialConfig, TrialRecord
from autotune.hf.models import resolve_model
from autotune.launch.forkserver import ForkServer
from autotune.launch.runner import run_trial
from autotune.tuning._skips import skip_reason

pytestmark = pytest.mark.slow

SPACE = SearchSpace(
    global_batch_size=64,
    micro_batches=(8, 16, 32, 64),
    fallback_batches=(1, 2, 4),
    precisions=("fp32",),
    checkpointing=(False,),
    optimizers=("adamw_torch",),
)


def test_skips_only_batches_above_a_measured_oom(
    tmp_path: Path, tiny_gpt2: Path, tiny_budgets: TinyBudgets
) -> None:
    model = resolve_model(str(tiny_gpt2))
    limit = int(tiny_budgets.eight_fits_thirty_two_does_not * 0.95)
    # forked from one server, as a search's probes are (one import for the four)
    server = ForkServer(tmp_path / "forkserver.log", data_limit=limit)
    measured = {}
    try:
        for batch in SPACE.micro_batches:
            candidate = SPACE.candidate(batch, "fp32", False, "adamw_torch")
            config = TrialConfig(
                number=batch,
                trial_dir=str(tmp_path / str(batch)),
                model=model,
                candidate=candidate,
                device="cpu",
                seq_len=256,
                target_len=8,
                memory_limit_bytes=limit,
                warmup_steps=1,
                measure_steps=2,
            )
            result = run_trial(config, timeout_s=300, server=server)
            measured[batch] = TrialRecord(batch, candidate, result)
    finally:
        server.close()
    outcomes = {b: r.result.outcome for b, r in measured.items()}
    assert outcomes[8] == Outcome.OK and outcomes[64] == Outcome.OOM  # a real boundary
    for batch, record in measured.items():
        # What the search would know after probing only the smallest OOM batch:
        ooms = [r for r in measured.values() if r.result.outcome == Outcome.OOM]
        first_oom = min(ooms, key=lambda r: r.candidate.per_device_train_batch_size)
        skip = skip_reason(record.candidate, [first_oom], SPACE)
        if skip is not None and skip.implies_oom:
            assert record.result.outcome == Outcome.OOM, f"batch {batch} would have fit"
        if record.result.outcome == Outcome.OK:
            assert skip is None
