#!/usr/bin/env python
"""Each term of the memory estimate against the peaks a probe measures, on the CPU.

For the families' small models (benchmarks/families.py: GPT-2, T5, BERT), one probe of
each of fp32 and bf16 at batches 4, 8 and 16, and at batch 8 with checkpointing, through
the fork server a search uses, without a memory limit. Each probe reports its peak, the
resident set after its imports (the process term) and what its Trainer and data held
before the first step beyond the model (the setup term); the estimate gives the static
terms (weights, gradients, optimizer state) and the analytic activations. Prints, per
probe, what is left of the peak over the analytic activations (the scale a search fits),
and per batch what bf16 left against fp32: the share of the activations autocast saves
on the CPU, which core/precisions.py declares.

    python benchmarks/memory_terms.py            # about 5 minutes on 2 cores, alone
    python benchmarks/memory_terms.py --quick    # GPT-2 at batch 4 alone
"""

from __future__ import annotations

import argparse
from pathlib import Path

from families import FAMILIES, SEQ_LEN, TARGET_LEN, candidate, family_model
from harness import Benchmark, Figures, Prober, header, model_folder, run, table

from autotune.hf.models import count_parameters
from autotune.tuning.estimate import breakdown

MIB = 2**20
NO_LIMIT = 16 * 2**30
BATCHES = (4, 8, 16)
SHOWN = ("causal LM (gpt2)", "seq2seq (t5)", "encoder classifier (bert)")
# batch, precision, checkpointed, optimizer: as families.py names a config
KEYS = [(b, p, False, "adamw_torch") for b in BATCHES for p in ("fp32", "bf16")]
KEYS += [(8, p, True, "adamw_torch") for p in ("fp32", "bf16")]


def probe_family(family: str, work: Path, keys: list[tuple[int, str, bool, str]]) -> list[Figures]:
    model = family_model(family, model_folder(work, "model", FAMILIES[family]))
    counted = count_parameters(model)
    rows = []
    fields = {"seq_len": SEQ_LEN, "target_len": TARGET_LEN}
    with Prober(model, work, NO_LIMIT, fields=fields) as probe:
        for key in keys:
            result = probe(candidate(key), warmup=2, measure=1)
            terms = breakdown(
                counted.total,
                model.config,
                model.task,
                candidate(key),
                SEQ_LEN,
                TARGET_LEN,
                embedding=counted.embedding,
                largest=counted.largest,
                device_kind="cpu",
            )
            peak = result.peak_memory_bytes or 0
            process = int(result.baseline.get("rss_bytes", 0))
            setup = int(result.baseline.get("setup_bytes", 0))
            left = peak - process - setup - terms.static
            rows.append(
                {
                    "key": list(key),
                    "outcome": str(result.outcome),
                    "peak_mib": round(peak / MIB, 1),
                    "process_mib": round(process / MIB, 1),
                    "setup_mib": round(setup / MIB, 1),
                    "static_mib": round(terms.static / MIB, 1),
                    "activations_mib": round(terms.activations / MIB, 1),
                    "left_mib": round(left / MIB, 1),
                    "left_over_activations": round(left / terms.activations, 2),
                    "without_setup": round((left + setup) / terms.activations, 2),
                }
            )
            print(f"{family}: {rows[-1]}", flush=True)
    return rows


def bf16_share(rows: list[Figures]) -> dict[str, float]:
    """Per batch (and checkpointed 8), what bf16 left of the peak against fp32."""
    left = {tuple(r["key"][:3]): r["left_mib"] for r in rows}
    shares = {}
    for batch, ckpt in [*((b, False) for b in BATCHES), (8, True)]:
        fp32, bf16 = left.get((batch, "fp32", ckpt)), left.get((batch, "bf16", ckpt))
        if fp32 and bf16:
            shares[f"{batch}{' ckpt' if ckpt else ''}"] = round(bf16 / fp32, 3)
    return shares


def measure(args: argparse.Namespace, work: Path) -> Figures:
    shown, keys = (SHOWN[:1], KEYS[:2]) if args.quick else (SHOWN, KEYS)
    families = {f: probe_family(f, work / f.split()[0], keys) for f in shown}
    return {
        "families": families,
        "bf16_over_fp32": {f: bf16_share(rows) for f, rows in families.items()},
    }


def report(f: Figures) -> str:
    rows = [
        (
            family,
            f"{r['key'][0]} {r['key'][1]}{' ckpt' if r['key'][2] else ''}",
            r["peak_mib"],
            r["setup_mib"],
            r["left_mib"],
            r["left_over_activations"],
            r["without_setup"],
        )
        for family, family_rows in f["families"].items()
        for r in family_rows
    ]
    shares = "".join(
        f"- {family}: " + ", ".join(f"{k}: {v}" for k, v in s.items()) + "\n"
        for family, s in f["bf16_over_fp32"].items()
    )
    columns = ("family", "config", "peak MiB", "setup MiB", "left MiB", "/act", "no setup")
    return (
        header(f, "The memory estimate's terms against measured peaks")
        + "\nOne probe a config, no memory limit. `left`: the peak less the process, setup "
        "and static terms; `/act`: over the analytic activations at the precision's CPU "
        "scale; `no setup`: the same with the setup left to the activations.\n\n"
        + table(columns, rows)
        + f"\nbf16's `left` over fp32's, per batch:\n\n{shares}"
    )


if __name__ == "__main__":
    run(Benchmark("memory_terms", __doc__, measure, report))
