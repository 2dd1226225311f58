"""Training parity of a real search's finalists: each judged arithmetic's end loss against
the reference's, the verdict, and the tolerance with what it rests on.

    python benchmarks/parity.py --model tiny-gpt2 --model tiny-t5 [--append]
    python benchmarks/parity.py --model gpt2 --model google/mt5-small --max-trials 8

Each model gets one `autotune search` (parity on) with fp32/bf16 x adamw_torch,
adamw_torch_fused, adafactor, sgd, so that finalists alter the arithmetic in the ways
users meet; the table is read back from the study.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import autotune, machine, save

TINY = {
    "tiny-gpt2": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64,
                  "n_layer": 2, "n_head": 4, "n_positions": 256, "vocab_size": 512},
    "tiny-t5": {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"],
                "d_model": 64, "d_ff": 128, "d_kv": 16, "num_layers": 2, "num_heads": 4,
                "vocab_size": 512, "decoder_start_token_id": 0, "pad_token_id": 0,
                "eos_token_id": 1, "is_encoder_decoder": True},
}  # fmt: skip


def search(model: str, work: Path, max_trials: int, steps: int) -> dict[str, Any]:
    name = model
    if model in TINY:
        (work / model).mkdir(parents=True, exist_ok=True)
        (work / model / "config.json").write_text(json.dumps(TINY[model]))
        name = f"./{model}"
    started = time.monotonic()
    done = autotune(
        work, "search", "--model", name, "--study", "parity", "--device", "cpu",
        "--global-batch-size", "16", "--seq-len", "64", "--target-len", "16",
        "--precisions", "fp32,bf16", "--checkpointing", "off",
        "--optimizers", "adamw_torch,adamw_torch_fused,adafactor,sgd",
        "--max-trials", str(max_trials), "--warmup-steps", "1", "--measure-steps", "3",
        "--confirm-top", "3", "--parity-steps", str(steps), "--quiet",
    )  # fmt: skip
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"search on {model} failed:\n{done.stdout}\n{done.stderr}")
    import optuna

    study = optuna.load_study(study_name="parity", storage=f"sqlite:///{work}/studies/autotune.db")
    state = json.loads(study.user_attrs["autotune_parity"])
    summary = json.loads((work / "studies" / "parity.best.summary.json").read_text())
    parity_lines = [line for line in done.stdout.splitlines() if line.startswith("parity")]
    return {"model": model, "search_s": round(elapsed, 1), "state": state,
            "exported": summary["best"]["config"], "lines": parity_lines}  # fmt: skip


def table(runs: list[dict[str, Any]], steps: int) -> str:
    info = machine()
    out = [
        f"\n## Training parity of a search's finalists ({info['date']})\n",
        f"{info['machine']}; {info['versions']}. One `autotune search` per model, "
        f"`--parity-steps {steps}`, global batch 16, 64 tokens (`benchmarks/parity.py`).\n",
        "| model | finalist arithmetic | end loss | ratio to reference | gap (share of the "
        "reference's progress) | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        state = run["state"]
        curves = state["curves"]
        ref = curves["reference"]["points"]
        out.append(f"| {run['model']} | reference ({state['reference']['precision']} "
                   f"{state['reference']['optim']}) | {ref[-1][1]:.4g} | 1 | 0 | reference |")  # fmt: skip
        for key, verdict in sorted(state["verdicts"].items()):
            ratio = (verdict["final_loss"] / verdict["reference_final_loss"]
                     if verdict.get("final_loss") and verdict.get("reference_final_loss")
                     else None)  # fmt: skip
            gap = verdict.get("gap")
            out.append(
                f"| {run['model']} | {key.replace('|', ' ')} | "
                f"{verdict['final_loss']:.4g} | {ratio:.3f} | "
                f"{gap:+.1%} | {verdict['status']} |"
                if ratio is not None and gap is not None
                else f"| {run['model']} | {key.replace('|', ' ')} | | | | "
                f"{verdict['status']}: {verdict['reason']} |"
            )
    out.append("")
    for run in runs:
        tol = run["state"]["tolerance"]
        rests = ("the 5% floor" if tol["rounding_gap"] is None
                 else f"max(5% floor, 4 x the split twin's gap {tol['rounding_gap']:.2%})")  # fmt: skip
        out.append(f"- {run['model']}: tolerance {tol['fraction']:.1%} of the reference's "
                   f"progress ({rests}); exported {run['exported']}; search with parity "
                   f"runs {run['search_s']:.0f} s.")  # fmt: skip
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--max-trials", type=int, default=8)
    parser.add_argument("--parity-steps", type=int, default=30)
    parser.add_argument("--append", action="store_true", help="add to RESULTS.md")
    options = parser.parse_args()
    runs = []
    for model in options.model:
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(search(model, Path(tmp), options.max_trials, options.parity_steps))
    figures = {**machine(), "runs": runs}
    save("parity", figures, table(runs, options.parity_steps), options.append)


if __name__ == "__main__":
    main()
