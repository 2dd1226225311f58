"""The examples as a new user runs them on the CPU (examples/README.md, the docstrings)."""

from __future__ import annotations

import json
import os
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
