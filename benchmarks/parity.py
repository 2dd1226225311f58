#!/usr/bin/env python
"""Training parity of a real search's finalists: each judged arithmetic's end loss against
the reference's, the verdict, and the tolerance with what it rests on.

Each model gets one `autotune search` (parity on) with fp32/bf16 x adamw_torch,
adamw_torch_fused, adafactor, sgd, so that finalists alter the arithmetic in the ways
users meet; the table is read back from the study.

    python benchmarks/parity.py [--record]  # tiny-gpt2 and tiny-t5, 8 trials each
    python benchmarks/parity.py --model gpt2 --model google/mt5-small --max-trials 8
    python benchmarks/parity.py --readme --model google/mt5-small  # the README's job
    python benchmarks/parity.py --quick  # tiny-gpt2, 4 trials, 5 parity steps
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from harness import Benchmark, Figures, gpt2, header, model_folder, readme_main_job, run, search

TINY = {
    "tiny-gpt2": gpt2(n_embd=64, vocab_size=512),
    "tiny-t5": {
        "model_type": "t5",
        "architectures": ["T5ForConditionalGeneration"],
        "d_model": 64,
        "d_ff": 128,
        "d_kv": 16,
        "num_layers": 2,
        "num_heads": 4,
        "vocab_size": 512,
        "decoder_start_token_id": 0,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "is_encoder_decoder": True,
    },
}
SMALL_SEARCH = [
    *("--device", "cpu", "--global-batch-size", "16", "--seq-len", "64", "--target-len", "16"),
    *("--precisions", "fp32,bf16", "--checkpointing", "off"),
    *("--optimizers", "adamw_torch,adamw_torch_fused,adafactor,sgd"),
    *("--warmup-steps", "1", "--measure-steps", "3", "--confirm-top", "3"),
    *("--lever", "torch_compile=false", "--lever", "attn_implementation=sdpa"),
]


def searched(model: str, work: Path, flags: list[str]) -> dict[str, Any]:
    """One search of `model` with parity on; its parity state read from the study."""
    import optuna

    work.mkdir(parents=True, exist_ok=True)
    name = f"./{model_folder(work, model, TINY[model]).name}" if model in TINY else model
    if "--model" in flags:
        flags[flags.index("--model") + 1] = name
    else:
        flags = ["--model", name, *flags]
    done = search(work, "parity", *flags)
    study = optuna.load_study(study_name="parity", storage=f"sqlite:///{work}/studies/autotune.db")
    raw = study.user_attrs.get("autotune_parity")
    summary = json.loads((work / "studies" / "parity.best.summary.json").read_text())
    return {
        "model": model,
        "command": "autotune search " + shlex.join(flags),
        "search_s": done.wall_s,
        "state": json.loads(raw) if raw else None,
        "exported": summary["best"]["config"],
        "parity": summary["parity"],
        "output": done.output.splitlines(),
    }


def measure(args: argparse.Namespace, work: Path) -> Figures:
    models = args.model or (["tiny-gpt2"] if args.quick else ["tiny-gpt2", "tiny-t5"])
    trials = args.max_trials or (None if args.readme else 4 if args.quick else 8)
    steps = args.parity_steps or (5 if args.quick else 20)
    flags = [*(readme_main_job() if args.readme else SMALL_SEARCH), "--parity-steps", str(steps)]
    flags += ["--quiet", *(["--max-trials", str(trials)] if trials else [])]
    runs = [searched(m, work / str(i), list(flags)) for i, m in enumerate(models)]
    return {"parity_steps": steps, "runs": runs}


def rows(one: dict[str, Any]) -> list[str]:
    """The model's reference, its split twin (judged as a finalist would be) and each
    finalist's verdict."""
    from autotune.core.parity import judge, tolerance
    from autotune.core.parity_state import ParityState

    model = one["model"]
    if one["state"] is None:
        return [f"| {model} | every finalist had the recipe's arithmetic | | | | same-arithmetic |"]
    parity = ParityState.from_json(json.dumps(one["state"]))
    ref = parity.curves["reference"]
    recipe = f"{parity.reference.precision} {parity.reference.optim}"
    out = [f"| {model} | reference: {recipe} | {ref.end:.4g} | 1 | 0 | |"]
    if "twin" in parity.curves:
        twin = judge(ref, parity.curves["twin"], tolerance(ref, None))
        out.append(
            f"| {model} | split twin: {recipe}, another batch split | {twin.final_loss:.4g} | "
            f"{twin.ratio:.4f} | {twin.gap:+.2%} | (calibration) |"
        )
    for key, v in sorted(parity.verdicts.items()):
        name = key.replace("|", " ")
        if v.ratio is None or v.gap is None:
            out.append(f"| {model} | {name} | | | | {v.status}: {v.reason} |")
        else:
            figures = f"{v.final_loss:.4g} | {v.ratio:.3f} | {v.gap:+.1%}"
            out.append(f"| {model} | {name} | {figures} | {v.status} |")
    return out


def rests(one: dict[str, Any]) -> str:
    tol = (one["state"] or {}).get("tolerance")
    if tol is None:
        return "no parity run"
    twin = tol["rounding_gap"]
    floor = (
        "the 5% floor (no twin)" if twin is None else f"max(5% floor, 4 x the twin's {twin:.2%})"
    )
    return f"tolerance {tol['fraction']:.1%} of the reference's progress = {floor}"


def report(f: Figures) -> str:
    lines = [
        header(f, "Training parity of a search's finalists"),
        f"`--parity-steps {f['parity_steps']}`. End loss: the mean held-out loss over the "
        "last quarter of the run; gap: (end - reference end) as a share of the reference's "
        "progress.\n",
        "| model | run | end loss | ratio to reference | gap | verdict |",
        "|---|---|---|---|---|---|",
        *(row for r in f["runs"] for row in rows(r)),
        "",
    ]
    for r in f["runs"]:
        lines.append(
            f"- {r['model']}: {rests(r)}; exported {r['exported']} ({r['parity']['status']}); "
            f"the search took {r['search_s']:.0f} s: `{r['command']}`"
        )
    return "\n".join(lines) + "\n"


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", help="[default: tiny-gpt2, tiny-t5]")
    parser.add_argument("--readme", action="store_true", help="the README main job's flags")
    parser.add_argument("--max-trials", type=int, help="[default: 8; --readme: the README's]")
    parser.add_argument("--parity-steps", type=int, help="[default: 20]")


if __name__ == "__main__":
    run(Benchmark("parity", __doc__, measure, report, options))
