"""The levers beyond the classic five (#17), measured: per model, one search over a space
small enough to probe whole (so the best without the levers is measured too, not
guessed), selected by time to finish --train-steps; the table sets three configs side by
side: the plain default (the search's first probe), the best of the classic dimensions
alone (levers at their plain values), and the best with the levers.

    python benchmarks/levers.py            # both models, about 20 minutes on 2 cores
    python benchmarks/levers.py --models gpt2

Run it alone on the machine: the figures are throughputs. It prints the table and
writes benchmarks/levers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = 1000
MODELS = {
    # the README's main job's shapes; the attention kept at sdpa (8 configs, 4 compiled)
    "google/mt5-small": [
        "--global-batch-size",
        "16",
        "--seq-len",
        "64",
        "--target-len",
        "16",
        "--lever",
        "attn_implementation=sdpa",
    ],
    # a small causal LM (124M): one batch split, sdpa and eager (8 configs, 4 compiled)
    "gpt2": ["--global-batch-size", "8", "--seq-len", "128"],
}
COMMON = [
    "--precisions",
    "fp32,bf16",
    "--optimizers",
    "adamw_torch",
    "--checkpointing",
    "off",
    "--measure-steps",
    "3",
    "--max-trials",
    "8",
    "--confirm-top",
    "0",
    "--parity",
    "off",
    "--train-steps",
    str(STEPS),
]


def autotune(cwd: Path, *args: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"autotune {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def measure(model: str, cwd: Path) -> dict[str, object]:
    study = model.replace("/", "-")
    started = time.monotonic()
    autotune(cwd, "search", "--model", model, "--study", study, *MODELS[model], *COMMON)
    wall = time.monotonic() - started
    view = json.loads(autotune(cwd, "show", "--study", study, "--format", "json"))
    ok = [t for t in view["trials"] if t["outcome"] == "ok"]
    plain_levers = {n: v[0] for n, v in view["levers"].items()}
    chosen = next(t for t in ok if t["best"])
    default = min(ok, key=lambda t: t["trial"])  # the search's first probe: the default

    def plain(t: dict[str, object]) -> bool:
        args = t["training_arguments"]
        assert isinstance(args, dict)
        compiled = bool(args.get("torch_compile", False))
        attn = str(t["config"]).split()[-1] if plain_levers else ""
        return compiled == plain_levers.get("torch_compile", False) and (
            "attn_implementation" not in plain_levers or attn == plain_levers["attn_implementation"]
        )

    classic = min((t for t in ok if plain(t)), key=lambda t: t["finish_s"])
    fastest = max(ok, key=lambda t: t["samples_per_s"])
    rows = {
        "plain default": default,
        "best without levers": classic,
        "best with levers (selected)": chosen,
        "highest throughput": fastest,
    }
    return {
        "model": model,
        "search_wall_s": round(wall, 1),
        "probed": len(view["trials"]),
        "levers": view["levers"],
        "not_offered": view["levers_not_offered"],
        "rows": {
            name: {
                "config": t["config"],
                "samples_per_s": t["samples_per_s"],
                "one_time_s": t["one_time_s"],
                "finish_1000_steps_s": t["finish_s"],
                "peak_gib": t["peak_memory_gib"],
            }
            for name, t in rows.items()
        },
    }


def table(results: list[dict[str, object]]) -> str:
    lines = [
        f"| model | config | samples/s | one-time s | {STEPS} steps | peak GiB |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for result in results:
        rows = result["rows"]
        assert isinstance(rows, dict)
        for name, row in rows.items():
            lines.append(
                f"| {result['model']} | {name}: {row['config']} | {row['samples_per_s']:.2f} | "
                f"{row['one_time_s']:.1f} | {row['finish_1000_steps_s']:.0f} s | "
                f"{row['peak_gib']:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="autotune-levers-") as tmp:
        results = [measure(model, Path(tmp)) for model in options.models]
    out = Path(__file__).with_name("levers.json")
    out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(table(results))
    for result in results:
        print(
            f"{result['model']}: search {result['search_wall_s']} s, {result['probed']} "
            f"configs; levers {result['levers']}"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
