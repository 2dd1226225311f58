"""ZeRO stages against plain DDP (#17's sharding lever), measured on this CPU: two-process
probes, the way a search runs them (torchrun, gloo, the real Trainer under DeepSpeed), of
two GPT-2 shapes: one where activations weigh as much as the states, one where the
states (weights, gradients, AdamW's moments) dominate. Per stage: samples/s, the peak
resident memory per process, and the static bytes per process the estimate expects.

    python benchmarks/zero_stages.py            # about 4 minutes on 2 cores

Run it alone on the machine: the figures are throughputs. It prints the table and
writes benchmarks/zero_stages.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.core.enums import DeviceKind  # noqa: E402
from autotune.core.levers import shards  # noqa: E402
from autotune.core.trial import Candidate, ModelSpec, TrialConfig  # noqa: E402
from autotune.hf.models import count_parameters  # noqa: E402
from autotune.hf.training_args import tuned_arguments  # noqa: E402
from autotune.launch.runner import run_trial  # noqa: E402
from autotune.tuning.estimate import static_bytes  # noqa: E402

GPT2 = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_head": 8,
    "n_positions": 256,
    "vocab_size": 32000,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
SHAPES = {
    # name: (config, micro-batch, tokens)
    "gpt2 512x4 (29M), batch 16x64": ({**GPT2, "n_embd": 512, "n_layer": 4}, 16, 64),
    "gpt2 1024x4 (83M), batch 2x16": ({**GPT2, "n_embd": 1024, "n_layer": 4}, 2, 16),
}
MiB = 2**20


def probe(folder: Path, model: ModelSpec, batch: int, tokens: int, stage: int) -> dict:
    candidate = Candidate(batch, 1, "fp32", False, "adamw_torch", zero_stage=stage)
    config = TrialConfig(
        number=stage,
        trial_dir=str(folder / f"zero{stage}"),
        model=model,
        candidate=candidate,
        device="cpu",
        seq_len=tokens,
        target_len=0,
        memory_limit_bytes=None,
        warmup_steps=2,
        measure_steps=4,
        nproc_per_node=2,
        training_arguments=tuned_arguments(candidate, device_kind=DeviceKind.CPU),
    )
    result = run_trial(config, timeout_s=600)
    params = count_parameters(model).total
    return {
        "stage": stage,
        "outcome": str(result.outcome),
        "samples_per_s": result.samples_per_s,
        "peak_mib": (result.peak_memory_bytes or 0) // MiB,
        "static_estimate_mib": static_bytes(params, "fp32", "adamw_torch", shards(stage, 2)) // MiB,
        "parameters": params,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-append", action="store_true", help="do not write the JSON")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (config, batch, tokens) in list(SHAPES.items())[1:]:
            model = ModelSpec(name, "local", "causal-lm", config)
            for stage in (3,):
                row = {
                    "shape": name,
                    **probe(Path(tmp) / str(len(rows)), model, batch, tokens, stage),
                }
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print("| shape | ZeRO stage | samples/s | peak per process | estimated states per process |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        stage = "0 (DDP)" if r["stage"] == 0 else str(r["stage"])
        speed = f"{r['samples_per_s']:.2f}" if r["samples_per_s"] else r["outcome"]
        print(
            f"| {r['shape']} | {stage} | {speed} | {r['peak_mib']} MiB "
            f"| {r['static_estimate_mib']} MiB |"
        )
    if not args.no_append:
        (ROOT / "benchmarks" / "zero_stages.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
