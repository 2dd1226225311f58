"""The real child on tiny models: figures, a real OOM under RLIMIT_DATA, a real NaN."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_GPT2, write_model

from autotune.core.subnormals import SHARE
from autotune.core.trial import Candidate, Outcome, TrialConfig
from autotune.hf.models import resolve_model
from autotune.launch.runner import run_trial

pytestmark = pytest.mark.slow
MIB = 2**20


def trial(tmp_path: Path, model: Path, candidate: Candidate, **kw: object) -> TrialConfig:
    args: dict[str, object] = dict(
        number=0,
        trial_dir=str(tmp_path / "trial"),
        model=resolve_model(str(model)),
        candidate=candidate,
        device="cpu",
        seq_len=64,
        target_len=16,
        memory_limit_bytes=None,
        warmup_steps=2,
        measure_steps=3,
    )
    args.update(kw)
    return TrialConfig(**args)  # type: ignore[arg-type]


def test_probe_measures_whole_optimizer_steps(tmp_path: Path, tiny_t5: Path) -> None:
    config = trial(tmp_path, tiny_t5, Candidate(8, 2, "bf16", True, "adamw_torch"))
    result = run_trial(config, timeout_s=300)
    assert result.outcome == Outcome.OK, result.reason
    assert len(result.step_times_s) == 3
    assert result.samples_per_s == pytest.approx(16 / result.step_time_median_s)
    assert min(result.step_times_s) <= result.step_time_quiet_s <= result.step_time_median_s
    assert result.tokens_per_s == pytest.approx(result.samples_per_s * (64 + 16))
    assert result.loss_finite and result.peak_memory_bytes > 100 * MIB
    assert {"torch", "transformers", "device"} <= set(result.versions)
    assert {"import", "build", "train", "warmup", "measured_steps", "total"} <= set(result.phases_s)
    # Figures against the hardware: a matrix multiply at bf16 on this CPU is the peak.
    assert result.peak_flops_per_s is not None and result.peak_flops_per_s > 1e8
    assert result.mfu is not None and 0 < result.mfu < 1.5
    # Its optimizer's state read for subnormal numbers: none made, so the CPU not timed
    assert result.subnormal_share is not None and result.subnormal_share < SHARE
    assert result.subnormal_slowdown is None


def test_probe_can_be_rerun_by_hand(tmp_path: Path, tiny_gpt2: Path) -> None:
    config = trial(tmp_path, tiny_gpt2, Candidate(8, 1, "fp32", False, "adafactor"))
    run_trial(config, timeout_s=300)
    config_path = Path(config.trial_dir) / "config.json"
    (Path(config.trial_dir) / "result.json").unlink()
    subprocess.run([sys.executable, "-m", "autotune.probe", str(config_path)], check=True)
    rerun = json.loads((Path(config.trial_dir) / "result.json").read_text())
    assert rerun["outcome"] == "ok"


@pytest.mark.parametrize("content", ["", '{"number": 0, "trial_d', "\x00\x01 garbage", "[1, 2]"])
def test_a_trial_config_a_crash_truncated_is_named_when_rerun_by_hand(
    tmp_path: Path, content: str
) -> None:
    config_path = tmp_path / "trial" / "config.json"
    config_path.parent.mkdir()
    config_path.write_text(content)
    done = subprocess.run(
        [sys.executable, "-m", "autotune.probe", str(config_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {config_path} is not a trial's config.json")
    assert "rerun the search" in line
    assert not (config_path.parent / "result.json").exists()


def test_real_out_of_memory_under_rlimit_data(tmp_path: Path, tiny_gpt2: Path) -> None:
    config = trial(
        tmp_path,
        tiny_gpt2,
        Candidate(64, 1, "fp32", False, "adamw_torch"),
        seq_len=256,
        memory_limit_bytes=800 * MIB,
    )
    result = run_trial(config, timeout_s=300)
    assert result.outcome == Outcome.OOM
    assert "allocate" in result.error  # the allocator's own error, not a fake
    # The peak it reached on its way to the limit is recorded (resident memory, which
    # can sit a little above the data-segment limit that stopped it).
    assert 400 * MIB < (result.peak_memory_bytes or 0) < 1200 * MIB
    # what the process held before training, kept: the memory predictor's process term,
    # with what the Trainer and its data held before the first step beyond the model
    assert (result.baseline.get("rss_bytes") or 0) > 100 * MIB
    assert 0 < result.baseline["setup_bytes"] < 200 * MIB


@pytest.mark.parametrize("budget_mib", [300, 350])
def test_a_budget_below_what_the_imports_hold_is_an_oom_not_a_hang(
    tmp_path: Path, tiny_gpt2: Path, budget_mib: int
) -> None:
    """A probe holds 400-480 MiB of data segment after its imports here. Under RLIMIT_DATA
    from the start, a malloc failing inside scipy's OpenBLAS init (transformers imports
    scipy) spun for ever at 350 MiB: the probe timed out, and a fork server waited 300 s
    to give up. At 300 MiB a MemoryError could come where the probe could no longer write
    its result."""
    from autotune.launch.forkserver import ForkServer, ServerStartError

    config = trial(
        tmp_path,
        tiny_gpt2,
        Candidate(8, 2, "fp32", False, "adamw_torch"),
        memory_limit_bytes=budget_mib * MIB,
    )
    result = run_trial(config, timeout_s=120)
    assert result.outcome == Outcome.OOM, result.reason
    assert "after its imports the process holds" in result.error
    with pytest.raises(ServerStartError, match="out of memory while importing"):
        ForkServer(tmp_path / "forkserver.log", data_limit=budget_mib * MIB)


def test_a_job_making_subnormal_numbers_has_them_counted_and_the_cpu_timed(
    tmp_path: Path,
) -> None:
    """Logits of std 24 over 8192 tokens (a tied head at std 3) leave some of the softmax
    subnormal, and their gradients leave about 4% of Adam's state so: the probe reads the
    share after its steps, and what this CPU pays for them."""
    wide = write_model(
        tmp_path / "wide", {**TINY_GPT2, "vocab_size": 8192, "initializer_range": 3.0}
    )
    config = trial(tmp_path, wide, Candidate(8, 1, "fp32", False, "adamw_torch"))
    result = run_trial(config, timeout_s=300)
    assert result.outcome == Outcome.OK, result.reason
    assert result.subnormal_share is not None and SHARE <= result.subnormal_share < 0.5
    assert result.subnormal_slowdown is not None and result.subnormal_slowdown > 0
    assert "subnormals" in result.phases_s


def test_nan_loss_is_unstable(tmp_path: Path) -> None:
    exploding = write_model(tmp_path / "nan", {**TINY_GPT2, "initializer_range": 1e30})
    config = trial(tmp_path, exploding, Candidate(8, 1, "fp32", False, "adamw_torch"))
    result = run_trial(config, timeout_s=300)
    assert result.outcome == Outcome.UNSTABLE
    assert "not finite" in result.reason


def test_the_cpu_budget_means_resident_memory_within_a_few_percent(
    tmp_path: Path, tiny_gpt2: Path, tiny_budgets: object
) -> None:
    """No import-time reservation eats the budget: a limit 8% above a config's measured
    peak lets it run and fit; 8% below, it does not fit (a real OOM, or a run whose peak is
    over the limit). With pyarrow's mimalloc pool, ~1 GiB of reserved address space
    counted against the limit and both ran out of memory."""
    peak = tiny_budgets.peaks[(8, "fp32")]  # type: ignore[attr-defined]
    base = dict(seq_len=256, warmup_steps=2, measure_steps=3)
    candidate = Candidate(8, 2, "fp32", False, "adamw_torch")
    above = trial(
        tmp_path / "above", tiny_gpt2, candidate, memory_limit_bytes=int(1.08 * peak), **base
    )
    below = trial(
        tmp_path / "below", tiny_gpt2, candidate, memory_limit_bytes=int(0.92 * peak), **base
    )
    fits = run_trial(above, timeout_s=300)
    assert fits.outcome == Outcome.OK, fits.reason
    assert (fits.peak_memory_bytes or 0) <= int(1.08 * peak)
    short = run_trial(below, timeout_s=300)
    assert short.outcome == Outcome.OOM or (short.peak_memory_bytes or 0) > int(0.92 * peak)
    # The probe reports where it started from: data segment near the resident set.
    b = fits.baseline
    assert b["vmdata_bytes"] - b["rss_bytes"] < 512 * MIB, b
