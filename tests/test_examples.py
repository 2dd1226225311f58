"""The examples as a new user runs them on the CPU (examples/README.md, the docstrings)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


def test_the_lora_sft_example_prepares_its_job_and_trains_from_an_sftconfig_file(
    tmp_path: Path,
) -> None:
    """`lora_sft.py prepare`, then `lora_sft.py train FILE` with its own lora_sft.json as
    the file (what the export writes has the same form; the search through its
    make_trainer is the factory path tests/tuning/test_user_job_search.py runs)."""
    env = {**os.environ, "LORA_SFT_DIR": str(tmp_path / "lora-sft"), "HF_HUB_OFFLINE": "1"}
    script = str(ROOT / "examples" / "lora_sft.py")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, script, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    prepared = run("prepare")
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    theirs = json.loads((ROOT / "examples" / "lora_sft.json").read_text())
    # the CPU form: SFTConfig's bf16 needs use_cpu here; a few steps, not sixty
    short = {**theirs, "max_steps": 3, "use_cpu": True, "output_dir": str(tmp_path / "run")}
    (tmp_path / "args.json").write_text(json.dumps(short))
    trained = run("train", "args.json")
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "trained 3 steps with args.json: loss" in trained.stdout


def test_the_readmes_quick_start_searches_exports_and_trains_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/quickstart/ as the README pastes it (tests/test_readme.py holds the two the
    same), with its one override: TRAIN_MODEL and TRAIN_DATA name a tiny local chat model
    and conversations in place of the hub's. The README's search (its budget kept; two
    probes, the parity judged from them), its export into args.json, then the run, two
    steps of it."""
    from conftest import autotune
    from job_script import write_chat_job

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import docs_as_written as docs
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    commands = [shlex.split(c)[1:] for c in docs.gpu_block((ROOT / "README.md").read_text())]
    (search,) = [c for c in commands if c[:1] == ["search"]]
    (export,) = [c for c in commands if c[:1] == ["export"]]

    for name in ("train.py", "args.json"):
        (tmp_path / name).write_text((ROOT / "examples" / "quickstart" / name).read_text())
    model, data = write_chat_job(tmp_path)
    monkeypatch.setenv("TRAIN_MODEL", str(model))
    monkeypatch.setenv("TRAIN_DATA", str(data))
    recipe = json.loads((tmp_path / "args.json").read_text())

    searched = autotune(
        tmp_path,
        *search,
        *("--device", "cpu", "--memory-budget", "4GiB", "--max-trials", "2"),
        *("--parity", "quick", "--lever", "torch_compile=false", "--quiet"),
    )
    assert searched.returncode == 0, searched.stderr[-3000:]
    exported = autotune(tmp_path, *export)
    assert exported.returncode == 0, exported.stderr[-3000:]
    merged = json.loads((tmp_path / "args.json").read_text())
    global_batch = merged["per_device_train_batch_size"] * merged["gradient_accumulation_steps"]
    assert global_batch == 16 and merged["use_cpu"] is True
    assert {k: merged[k] for k in ("learning_rate", "max_steps", "max_length")} == {
        k: recipe[k] for k in ("learning_rate", "max_steps", "max_length")
    }
    short = {**merged, "max_steps": 2, "output_dir": str(tmp_path / "run")}
    (tmp_path / "short.json").write_text(json.dumps(short))
    trained = subprocess.run(
        [sys.executable, "train.py", "short.json"],
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (tmp_path / "run").is_dir()
