#!/usr/bin/env python
"""Packed rows against padded batches in a LoRA SFTTrainer job, on this machine: what the
search reads against what the user's own run takes to train the same samples.

The job: the tests' LoRA factory on a small bf16-stored Llama (a 32k vocabulary), samples
of 5 to 60 words, `max_length` 512, recipe 8 x 2. The search is asked for packing
(`--lever packing=false,true`), its precision and optimizer fixed to the recipe's, so
packing and the batch split are what it varies. A packed probe's step time is read as a
step of the global batch at the data's mean length (probe/_train.per_global_batch).

The truth: the user's factory trains one epoch of their data in its own process with the
search's best padded config and its best packed one, in interleaved rounds. Samples/s
is the epoch's samples over its training time (the first step, setup and compilation,
left out on both sides). The ratio packed / padded by the search is set beside the
ratio by those epochs.

    python benchmarks/packing.py [--no-append] [--rounds 2] [--time-budget 3m]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from _common import ROOT, autotune, machine, save
from jobs import prepare

sys.path.insert(0, str(ROOT / "tests"))
from job_script import WORDS

SAMPLES = 960  # an epoch: 60 padded steps of 16, fewer packed ones


def write_data(work: Path) -> dict[str, Any]:
    """The job's data (5-60 words a sample, no sample cut at 512 tokens) and its recipe."""
    rng = random.Random(0)
    lines = [" ".join(rng.choices(WORDS, k=rng.randint(5, 60))) for _ in range(SAMPLES)]
    (work / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    script = work / "job.py"
    script.write_text(script.read_text().replace("BITS = 4", "BITS = 16"))
    recipe = json.loads((work / "lora.json").read_text())
    recipe |= {"max_length": 512, "gradient_accumulation_steps": 2}
    (work / "lora.json").write_text(json.dumps(recipe))
    return recipe


def search(work: Path, budget: str, minutes: str) -> tuple[list[dict[str, Any]], int]:
    started = time.monotonic()
    done = autotune(
        work,
        "search",
        "--trainer",
        "job.py:qlora",
        "--base-args",
        "lora.json",
        "--device",
        "cpu",
        "--memory-budget",
        budget,
        "--time-budget",
        minutes,
        "--lever",
        "torch_compile=false",
        "--lever",
        "packing=false,true",
        "--precisions",
        "as-loaded",
        "--optimizers",
        "adamw_torch",
        "--checkpointing",
        "off",
        "--study",
        "packing",
        stamped=True,
    )
    (work / "packing.search.log").write_text(done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"search failed:\n{done.stdout[-3000:]}")
    shown = json.loads(autotune(work, "show", "--study", "packing", "--format", "json").stdout)
    return [t for t in shown["trials"] if t["outcome"] == "ok"], round(time.monotonic() - started)


def epoch(work: Path, fields: dict[str, Any]) -> float:
    """Samples/s of one epoch of the user's factory with these SFTConfig fields, in a
    process of its own (the first step left out)."""
    spec = work / "epoch.json"
    spec.write_text(json.dumps(fields))
    out = work / "epoch.out.json"
    done = subprocess.run(
        [sys.executable, __file__, "--epoch", str(work), str(spec), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"epoch failed:\n{done.stderr[-3000:]}")
    return float(json.loads(out.read_text())["samples_per_s"])


def run_epoch(work: Path, spec: Path, out: Path) -> None:
    """The child: their factory, one epoch, the samples each step trained counted from
    the position ids a packed row restarts (a padded batch: its rows)."""
    sys.path.insert(0, str(work))
    import job  # the user's script
    from transformers import HfArgumentParser, TrainerCallback
    from trl import SFTConfig

    (args,) = HfArgumentParser(SFTConfig).parse_dict(json.loads(spec.read_text()))
    trainer = job.qlora(args)
    ends: list[float] = []
    samples: list[int] = []

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            ends.append(time.perf_counter())

    def count(module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        positions = kwargs.get("position_ids")
        ids = kwargs["input_ids"]
        samples.append(int((positions == 0).sum()) if positions is not None else len(ids))

    trainer.add_callback(Steps())
    trainer.model.register_forward_pre_hook(count, with_kwargs=True)
    trainer.train()
    accumulation = args.gradient_accumulation_steps
    after_first = sum(samples[accumulation:])
    out.write_text(json.dumps({"samples_per_s": after_first / (ends[-1] - ends[0])}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved epochs of each")
    parser.add_argument("--budget", default="3GiB")
    parser.add_argument("--time-budget", default="3m")
    options = parser.parse_args()
    work = prepare(Path(tempfile.mkdtemp(prefix="autotune-packing-")), quick=True, long=False)
    recipe = write_data(work)
    trials, search_s = search(work, options.budget, options.time_budget)
    packed = [t for t in trials if t.get("samples_per_step")]
    padded = [t for t in trials if not t.get("samples_per_step")]
    if not packed or not padded:
        raise SystemExit(f"the search probed no packed or no padded config: {trials}")
    picks = {
        "padded": max(padded, key=lambda t: t["samples_per_s"]),
        "packed": max(packed, key=lambda t: t["samples_per_s"]),
    }
    run = {"max_steps": -1, "num_train_epochs": 1, "save_strategy": "no", "report_to": "none"}
    truth: dict[str, list[float]] = {name: [] for name in picks}
    for _ in range(options.rounds):
        for name, trial in picks.items():
            fields = {**recipe, **trial["training_arguments"], **run}
            fields["output_dir"] = str(work / f"runs-{name}")
            truth[name].append(round(epoch(work, fields), 2))
    best = next(t for t in trials if t["best"])
    figures = {
        **machine(),
        "samples": SAMPLES,
        "search_s": search_s,
        "probes": len(trials),
        "pick": best["config"],
        "configs": {
            name: {
                "config": t["config"],
                "search_samples_per_s": t["samples_per_s"],
                "samples_per_step": t.get("samples_per_step"),
                "peak_gib": t["peak_memory_gib"],
                "predicted_peak_gib": t["predicted_peak_gib"],
                "parity": t["parity"],
                "epoch_samples_per_s": truth[name],
            }
            for name, t in picks.items()
        },
    }
    by_search = picks["packed"]["samples_per_s"] / picks["padded"]["samples_per_s"]
    by_epochs = median(truth["packed"]) / median(truth["padded"])
    figures["packed_over_padded"] = {"search": round(by_search, 3), "epochs": round(by_epochs, 3)}
    save("packing", figures, _markdown(figures), append=not options.no_append)


def _markdown(figures: dict[str, Any]) -> str:
    rows = [
        f"| {name} | {c['config']} | {c['samples_per_step'] or ''} | "
        f"{c['search_samples_per_s']:.2f} | {', '.join(f'{x:.2f}' for x in c['epoch_samples_per_s'])} | "
        f"{c['predicted_peak_gib']:.2f} / {c['peak_gib']:.2f} GiB | {c['parity']} |"
        for name, c in figures["configs"].items()
    ]
    ratio = figures["packed_over_padded"]
    return (
        f"\n## Packed rows against padded batches ({figures['date']}, {figures['machine']})\n\n"
        "`python benchmarks/packing.py`: a LoRA SFTTrainer job on a small bf16 Llama (32k "
        f"vocabulary), {figures['samples']} samples of 5-60 words, max_length 512, recipe "
        f"8 x 2, searched with `--lever packing=false,true` ({figures['probes']} probes, "
        f"{figures['search_s']} s; export: {figures['pick']}). Epochs: the user's factory "
        "trains one epoch of their data with each config, interleaved.\n\n"
        "| | config | samples a step | samples/s by the search | samples/s by epochs | "
        "estimate / peak | parity |\n| --- | --- | --- | --- | --- | --- | --- |\n"
        + "\n".join(rows)
        + f"\n\nPacked over padded: {ratio['search']} by the search, {ratio['epochs']} by "
        "the epochs.\n"
    )


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--epoch":
        run_epoch(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        main()
