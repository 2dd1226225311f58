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
on the CPU, which core/precisions.py declares. Writes benchmarks/memory_terms.json and
appends a section to benchmarks/RESULTS.md.

    python benchmarks/memory_terms.py    # about 5 minutes on 2 cores, alone
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from _common import machine, save
from families import FAMILIES, SEQ_LEN, TARGET_LEN, Prober, candidate, family_model

from autotune.hf.models import count_parameters
from autotune.tuning.estimate import breakdown

MIB = 2**20
NO_LIMIT = 16 * 2**30
BATCHES = (4, 8, 16)
SHOWN = ("causal LM (gpt2)", "seq2seq (t5)", "encoder classifier (bert)")


def keys() -> list[tuple[int, str, bool, str]]:
    plain = [(b, p, False, "adamw_torch") for b in BATCHES for p in ("fp32", "bf16")]
    return plain + [(8, p, True, "adamw_torch") for p in ("fp32", "bf16")]


def probe_family(family: str, work: Path) -> list[dict[str, Any]]:
    model_dir = work / "model"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(FAMILIES[family]))
    model = family_model(family, model_dir)
    counted = count_parameters(model)
    prober = Prober(model, NO_LIMIT, work)
    rows = []
    try:
        for key in keys():
            result = prober(key, 1)
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
            process = int(result.baseline.get("rss_bytes", 0))
            setup = int(result.baseline.get("setup_bytes", 0))
            left = (result.peak_memory_bytes or 0) - process - setup - terms.static
            rows.append(
                {
                    "key": list(key),
                    "outcome": str(result.outcome),
                    "peak_mib": round((result.peak_memory_bytes or 0) / MIB, 1),
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
    finally:
        prober.server.close()
    return rows


def bf16_share(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per batch (and checkpointed 8), what bf16 left of the peak against fp32."""
    left = {(r["key"][0], r["key"][1], r["key"][2]): r["left_mib"] for r in rows}
    shares = {}
    for batch, ckpt in [*((b, False) for b in BATCHES), (8, True)]:
        fp32, bf16 = left.get((batch, "fp32", ckpt)), left.get((batch, "bf16", ckpt))
        if fp32 and bf16:
            shares[f"{batch}{' ckpt' if ckpt else ''}"] = round(bf16 / fp32, 3)
    return shares


def markdown(figures: dict[str, Any]) -> str:
    lines = [
        f"\n## The memory estimate's terms against measured peaks ({figures['date']}, "
        f"{figures['machine']})\n",
        "`benchmarks/memory_terms.py`: one probe a config, no memory limit, through the fork "
        "server. `left`: the peak less the process, setup and static terms; `/act`: over "
        "the analytic activations at the precision's CPU scale; `no setup`: the same with "
        "the setup left to the activations, as before the setup term.\n",
        "| family | config | peak MiB | setup MiB | left MiB | /act | no setup |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for family, rows in figures["families"].items():
        for r in rows:
            b, p, ckpt, _ = r["key"]
            lines.append(
                f"| {family} | {b} {p}{' ckpt' if ckpt else ''} | {r['peak_mib']} | "
                f"{r['setup_mib']} | {r['left_mib']} | {r['left_over_activations']} | "
                f"{r['without_setup']} |"
            )
    lines.append("\nbf16's `left` over fp32's, per batch:\n")
    for family, shares in figures["bf16_over_fp32"].items():
        lines.append(f"- {family}: " + ", ".join(f"{k}: {v}" for k, v in shares.items()))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-append", dest="append", action="store_false")
    args = parser.parse_args()
    families = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in SHOWN:
            families[family] = probe_family(family, Path(tmp) / family.split()[0])
    figures = {
        **machine(),
        "families": families,
        "bf16_over_fp32": {f: bf16_share(rows) for f, rows in families.items()},
    }
    save("memory_terms", figures, markdown(figures), args.append)


if __name__ == "__main__":
    main()
