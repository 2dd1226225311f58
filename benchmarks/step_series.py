"""Recorded step times for the adaptive-measurement tests (issue #15): every config of two
small spaces probed with a long fixed window (1 warm-up step, 14 timed), so the tests can
replay warm-up and early stopping on real series instead of invented ones.

    python benchmarks/step_series.py       # about 12 minutes on 2 cores, alone

Writes benchmarks/step_series.json: per model, each config's step durations from the
second step on (the first step has no mark before it), in the order they were probed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import HERE, autotune, machine

PLAIN = ["--lever", "torch_compile=false", "--lever", "attn_implementation=sdpa"]
MODELS = {
    "t5-small": [
        "--global-batch-size",
        "16",
        "--seq-len",
        "32",
        "--target-len",
        "8",
        "--optimizers",
        "adamw_torch,adafactor",
    ],
    "gpt2": [
        "--global-batch-size",
        "8",
        "--seq-len",
        "64",
        "--optimizers",
        "adamw_torch,adamw_torch_fused",
    ],
}
COMMON = [
    "--precisions",
    "fp32,bf16",
    "--checkpointing",
    "on,off",
    "--fixed-steps",
    "--warmup-steps",
    "1",
    "--measure-steps",
    "14",
    "--max-trials",
    "16",
    "--confirm-top",
    "0",
    "--parity",
    "off",
    "--sampler",
    "random",
    "--quiet",
    *PLAIN,
]


def record(model: str, work: Path) -> list[dict[str, object]]:
    study = model.replace("/", "-")
    done = autotune(work, "search", "--model", model, "--study", study, *MODELS[model], *COMMON)
    if done.returncode != 0:
        raise SystemExit(f"search of {model} failed:\n{done.stderr[-2000:]}")
    view = json.loads(autotune(work, "show", "--study", study, "--format", "json").stdout)
    series = []
    for trial in sorted(view["trials"], key=lambda t: t["trial"]):
        if trial["outcome"] != "ok":
            continue
        result = json.loads(
            (work / "studies" / study / "trials" / str(trial["trial"]) / "result.json").read_text()
        )
        series.append({"config": trial["config"], "durations": result["step_times_s"]})
    return series


def main() -> None:
    figures: dict[str, object] = {**machine(), "command": "python benchmarks/step_series.py"}
    with tempfile.TemporaryDirectory() as tmp:
        figures["models"] = {model: record(model, Path(tmp)) for model in MODELS}
    (HERE / "step_series.json").write_text(json.dumps(figures, indent=1) + "\n")
    for model, series in figures["models"].items():  # type: ignore[union-attr]
        print(model, len(series), "configs")


if __name__ == "__main__":
    main()
