#!/usr/bin/env python
"""Search efficiency across model families and budgets, every method run for real.

For each of three small models (a causal LM, a seq2seq model, an encoder classifier)
and two memory budgets (one that leaves the whole space free, one under which the
unconstrained best does not fit), on this machine's CPU:

1. the exhaustive grid: every config of the space probed once under the budget (10
   timed steps), then every config whose run came within 35% of the best's (a run can
   be 40% slow on this machine) timed again in interleaved rounds, each paired with the
   best round by round (_truth: a ratio with a 95% interval; a tie when it reaches 1,
   and a tie found counts as found);
2. four methods, each with the same trial budget (15% of the grid's probes) and 3
   seeds, each run for real and charged its real probe time, OOM launches included:
   `autotune search` with its defaults (the model of step time, adaptive measurement,
   confirmation; every probe it launches counts, confirmations included), and plain
   Optuna TPE, random and GP samplers driving the same probe (fixed windows), each
   selecting the best of its own measurements.

Every selected config is scored by the grid's truth. Prints the figures, writes
benchmarks/families.json and appends a section to benchmarks/RESULTS.md.

    pip install -e ".[bench]"   # scipy, for the GP sampler
    python benchmarks/families.py            # about an hour on 2 cores, alone
    # autotune only, scored against the grids recorded here (same machine), 3 seeds; each
    # setting first re-times two of its configs and says when this host runs them
    # otherwise than the grid's did (--no-host-check skips it):
    python benchmarks/families.py --grid benchmarks/families.json --only "t5), memory free" \
        --keep /tmp/studies
    # the memory-binds grids measured again under today's libraries (about 20 min),
    # written into the file, then autotune replayed against them:
    python benchmarks/families.py --grid benchmarks/families.json --only "memory binds" --regrid
    python benchmarks/families.py --grid benchmarks/families.json --only "memory binds"
    # every method side by side against the recorded grids (34 min): prints the table
    python benchmarks/families.py --grid benchmarks/families.json \
        --methods autotune,tpe,random,gp
    # autotune with a co-tenant that spins one core 15 s of every 30 s: slow spells on
    # cue, to measure how a ranking copes with a drifting host
    python benchmarks/families.py --grid benchmarks/families.json --co-tenant 15
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from _common import machine, save
from _truth import ROUNDS, Truth, interleaved, measure, paired, round_ratio
from search_efficiency import score  # samples/s within the limit, as the search judges

from autotune.core.checkpointing import Checkpointing
from autotune.core.space import SearchSpace, batch_choices
from autotune.core.trial import Candidate, ModelSpec, TrialConfig, TrialResult
from autotune.hf.models import resolve_model
from autotune.hf.peft import parse_lora
from autotune.launch.forkserver import ForkServer
from autotune.launch.runner import run_trial
from autotune.probe.shared_model import SharedModel

MIB = 2**20
GENEROUS = 16 * 2**30
GLOBAL_BATCH, SEQ_LEN, TARGET_LEN = 16, 128, 16
WARMUP, MEASURE = 2, 3
PRECISIONS = ("fp32", "bf16")
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adafactor")
PLAIN_OPTIM = ("adamw_torch", "adamw_torch_fused")  # AdamW's arithmetic, fused or not
SEEDS = (0, 1, 2)
SHARE = 0.15
GRID_MEASURE = 10  # the grid's steps per run: the truth is timed longer than a search's
NEAR = 0.35  # a config whose first run comes this close to the best's is a contender
# Re-timing a grid recorded before the truth was interleaved: its medians rest on 3 runs
# for every config within NEAR, so a median this close to the best's makes a contender.
REMEASURE_NEAR = 0.25
SMALL = {"vocab_size": 4096, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
FAMILIES: dict[str, dict[str, Any]] = {
    "causal LM (gpt2)": {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": 128,
        "n_layer": 4,
        "n_head": 4,
        "n_positions": 512,
        **SMALL,
    },
    "seq2seq (t5)": {
        "model_type": "t5",
        "architectures": ["T5ForConditionalGeneration"],
        "d_model": 128,
        "d_ff": 512,
        "d_kv": 32,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 4,
        "decoder_start_token_id": 0,
        **SMALL,
    },
    "encoder classifier (bert)": {
        "model_type": "bert",
        "architectures": ["BertForSequenceClassification"],
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "intermediate_size": 512,
        "max_position_embeddings": 512,
        "num_labels": 2,
        **SMALL,
    },
}
# A LoRA adapter on the causal LM (the stand-in's `--lora`): only the adapter trains, so
# the optimizers' state is tiny and the activations decide the memory
FAMILIES["causal LM with LoRA (gpt2)"] = FAMILIES["causal LM (gpt2)"]
LORA = {"causal LM with LoRA (gpt2)": "r=8,alpha=16,targets=c_attn"}
Key = tuple[int, str, bool, str]


def family_model(family: str, model_dir: Path) -> ModelSpec:
    """The family's model as its probes build it: with its LoRA adapter where it has one."""
    model = resolve_model(str(model_dir))
    lora = LORA.get(family)
    return dataclasses.replace(model, adapter=parse_lora(lora)) if lora else model


def key_of(c: Candidate) -> Key:
    """A config as the grids name it: checkpointing off or on as a bool, as the export's
    fields read back (`parse_key`) and a search's pick is named."""
    checkpointed = c.activation_checkpointing != Checkpointing.OFF
    return (c.per_device_train_batch_size, str(c.precision), checkpointed, c.optim)


def candidate(key: Key) -> Candidate:
    batch, precision, ckpt, optim = key
    return Candidate(
        batch, GLOBAL_BATCH // batch, precision, ckpt, optim, attn_implementation="sdpa"
    )


def space() -> SearchSpace:
    regular, fallback = batch_choices(GLOBAL_BATCH)
    return SearchSpace(GLOBAL_BATCH, regular, fallback, PRECISIONS, (False, True), OPTIMIZERS)


class Prober:
    """Probes of one model under one limit, through a fork server that built it once."""

    def __init__(self, model: ModelSpec, limit: int, work: Path) -> None:
        self.model, self.limit, self.work, self.count = model, limit, work, 0
        started = time.monotonic()
        self.server = ForkServer(
            work / f"server-{limit}.log",
            data_limit=limit,
            shared=SharedModel(model, 0, {"attn_implementation": "sdpa"}),
        )
        self.start_s = time.monotonic() - started

    def __call__(self, key: Key, measure: int = MEASURE) -> TrialResult:
        self.count += 1
        config = TrialConfig(
            number=self.count,
            trial_dir=str(self.work / "probes" / str(self.count)),
            model=self.model,
            candidate=candidate(key),
            device="cpu",
            seq_len=SEQ_LEN,
            target_len=TARGET_LEN,
            memory_limit_bytes=self.limit,
            warmup_steps=WARMUP,
            measure_steps=measure,
        )
        return run_trial(config, timeout_s=600, server=self.server)

    def speed(self, key: Key) -> float:
        """A grid run's samples/s within the limit (0: did not fit or failed)."""
        return score(self(key, GRID_MEASURE), self.limit)

    def close(self) -> None:
        self.server.close()


def measure_grid(prober: Prober) -> dict[str, Any]:
    """The truth, to a stated precision: every config once over GRID_MEASURE steps, then
    every config whose run came within NEAR of the best in interleaved rounds (_truth)."""
    started = time.monotonic()
    first = {key_of(c): prober(key_of(c), GRID_MEASURE) for c in space().candidates()}
    scores = {k: score(r, prober.limit) for k, r in first.items()}
    top = max(scores.values())
    near = [k for k, s in scores.items() if top > 0 and s >= (1 - NEAR) * top]
    truth = measure(prober.speed, near)
    return {
        "wall_s": time.monotonic() - started,
        "scores": scores,
        "truth": truth,
        "best": truth.best,
        "fit": sum(s > 0 for s in scores.values()),
        "peaks": {k: r.peak_memory_bytes or 0 for k, r in first.items()},
    }


def ratio(found: Key | None, grid: dict[str, Any]) -> float:
    """Best-found over grid-best: a contender's paired ratio (1 for a tie); any other
    config's score over the best's, both timed in the grid's first pass."""
    truth: Truth[Key] = grid["truth"]
    if found is None:
        return 0.0
    if found in truth.runs:
        return truth.score(found)
    scores = grid["scores"]
    return min(1.0, scores.get(found, 0.0) / max(scores.values()))


def keeps_arithmetic(key: Key) -> bool:
    """A config of the plain recipe's arithmetic: fp32 AdamW, fused or not."""
    return key[1] == "fp32" and key[3] in PLAIN_OPTIM


def _paired(a: Key, b: Key, grid: dict[str, Any]) -> tuple[float, float, float] | None:
    """`a` over `b` in the grid's interleaved rounds (ratio, low, high); None without two
    rounds of both."""
    runs = grid["truth"].runs
    if a not in runs or b not in runs:
        return None
    rounds = sorted(set(runs[a]) & set(runs[b]))
    if len(rounds) < 2:
        return None
    return round_ratio([runs[a][r] for r in rounds], [runs[b][r] for r in rounds])


def rule_best(grid: dict[str, Any]) -> Key:
    """The best config the export rule may pick in this grid: the best that keeps the
    recipe's arithmetic, or one that changes it where the grid's own paired rounds put
    its gain over that one above 1 (their interval's low end, as the search's
    `selection.significant` asks of its rounds). A keeping config outside the contenders
    ran under (1 - NEAR) of the best in the first pass: every contender's gain over it
    is taken as significant. With none keeping it that fits, the grid's best."""
    scores = grid["scores"]
    fitting = [k for k, v in scores.items() if v > 0]
    keeping = [k for k in fitting if keeps_arithmetic(k)]
    if not keeping:
        return grid["truth"].best
    keep = max(keeping, key=lambda k: ratio(k, grid))
    allowed = [keep]
    for key in fitting:
        if keeps_arithmetic(key) or key not in grid["truth"].runs:
            continue
        gain = _paired(key, keep, grid)
        if (gain is None and keep not in grid["truth"].runs) or (gain and gain[1] > 1.0):
            allowed.append(key)
    return max(allowed, key=lambda k: ratio(k, grid))


def rule_ratio(found: Key | None, grid: dict[str, Any]) -> float:
    """Best-found over the rule's best (`rule_best`): 1 for a tie in the grid's paired
    rounds, else their paired ratio (or the first pass's, outside the contenders)."""
    if found is None:
        return 0.0
    best = rule_best(grid)
    paired_ratio = _paired(found, best, grid)
    if paired_ratio is not None:
        return 1.0 if paired_ratio[2] >= 1.0 else paired_ratio[0]
    return min(1.0, ratio(found, grid) / max(ratio(best, grid), 1e-9))


def truth_json(truth: Truth[Key]) -> dict[str, Any]:
    last = 1 + max(r for rounds in truth.runs.values() for r in rounds)
    return {
        "rounds": {
            "|".join(map(str, k)): [None if r not in v else round(v[r], 2) for r in range(last)]
            for k, v in truth.runs.items()
        },
        "best": list(truth.best),
        "ties": [list(k) for k in truth.ties],
        "ratios": {"|".join(map(str, k)): round(v, 4) for k, v in truth.ratios.items()},
        "half_widths": {
            "|".join(map(str, k)): None if v == float("inf") else round(v, 4)
            for k, v in truth.half_widths.items()
        },
    }


def parse_key(text: str) -> Key:
    """A grid's config as families.json names it: checkpointing "True"/"False" (grids
    measured while it was a bool), "on"/"off" (since it is graded)."""
    batch, precision, ckpt, optim = text.split("|")
    if ckpt not in ("True", "False", "on", "off"):
        raise ValueError(f"{text}: checkpointing {ckpt!r} is not on/off")
    return (int(batch), precision, ckpt in ("True", "on"), optim)


def plain(name: str, prober: Prober, trials: int, seed: int) -> dict[str, Any]:
    """A plain Optuna sampler proposing configs, each probed for real."""
    samplers = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed, n_startup_trials=3, multivariate=True),
        "random": lambda: optuna.samplers.RandomSampler(seed=seed),
        "gp": lambda: optuna.samplers.GPSampler(seed=seed, n_startup_trials=3),
    }
    study = optuna.create_study(direction="maximize", sampler=samplers[name]())
    sp = space()
    measured: dict[Key, float] = {}
    started = time.monotonic()

    def objective(trial: optuna.Trial) -> float:
        key = (
            trial.suggest_categorical("batch", list(sp.all_batches)),
            trial.suggest_categorical("precision", list(PRECISIONS)),
            trial.suggest_categorical("checkpointing", [False, True]),
            trial.suggest_categorical("optim", list(OPTIMIZERS)),
        )
        value = score(prober(key), prober.limit)
        measured[key] = max(measured.get(key, 0.0), value)
        return value

    study.optimize(objective, n_trials=trials)
    best = max(measured, key=lambda k: measured[k])
    return {
        "found": best if measured[best] > 0 else None,
        "probes": trials,
        "wall_s": time.monotonic() - started + prober.start_s,
    }


def search_argv(model_dir: Path, budget: int, trials: int, seed: int, lora: str = "") -> list[str]:
    """`autotune search`'s arguments (after `autotune`) as the families run it: its
    defaults, the families' space and probe lengths, `trials` probes in all (the
    confirmation included), parity off (the grids time speed alone)."""
    return [
        "search",
        "--model",
        str(model_dir),
        *(["--lora", lora] if lora else []),
        "--device",
        "cpu",
        "--study",
        "bench",
        "--memory-budget",
        f"{budget // MIB}MiB",
        "--seed",
        str(seed),
        "--global-batch-size",
        str(GLOBAL_BATCH),
        "--seq-len",
        str(SEQ_LEN),
        "--target-len",
        str(TARGET_LEN),
        "--precisions",
        ",".join(PRECISIONS),
        "--optimizers",
        ",".join(OPTIMIZERS),
        "--checkpointing",
        "off,on",
        "--lever",
        "torch_compile=false",
        "--lever",
        "attn_implementation=sdpa",
        "--warmup-steps",
        str(WARMUP),
        "--measure-steps",
        str(MEASURE),
        "--max-trials",
        str(trials - 2),
        "--confirm-top",
        "1",
        "--parity",
        "off",
        "--no-reuse",
        "--quiet",
    ]


def autotune(
    model_dir: Path,
    work: Path,
    budget: int,
    trials: int,
    seed: int,
    keep: str | None = None,
    lora: str = "",
) -> dict[str, Any]:
    """`autotune search` with its defaults, in a fresh directory (nothing to reuse);
    with `keep`, its studies/ are copied to keep/<model>-<budget>-seed<seed>; `lora`:
    the stand-in's adapter."""
    run_dir = Path(tempfile.mkdtemp(dir=work))
    argv = [sys.executable, "-m", "autotune", *search_argv(model_dir, budget, trials, seed, lora)]
    started = time.monotonic()
    done = subprocess.run(
        argv,
        cwd=run_dir,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    wall = time.monotonic() - started
    if keep:
        shutil.copytree(
            run_dir / "studies", Path(keep) / f"{model_dir.name}-{budget // MIB}MiB-seed{seed}"
        )
    best_file = run_dir / "studies" / "bench.best.json"
    probes, wasted = probe_counts(run_dir / "studies")
    return {
        "found": exported(best_file) if done.returncode == 0 else None,
        "probes": probes,
        "wasted": wasted,
        "wall_s": wall,
        "exit": done.returncode,
        "stderr": done.stderr[-400:] if done.returncode else "",
    }


def probe_counts(studies: Path) -> tuple[int, int]:
    """(probes a search launched, confirmations included; of them, those that ran out of
    memory or peaked over the limit a probe may use: launches the memory estimate could
    have spared) in a search's studies/ folder."""
    study = optuna.load_study(study_name="bench", storage=f"sqlite:///{studies}/autotune.db")
    ran = [
        t.user_attrs
        for t in study.trials
        if t.user_attrs.get("outcome") not in (None, "skipped")
        and not t.user_attrs.get("reused_from")
    ]
    over = [
        a
        for a in ran
        if a["outcome"] == "oom" or (a["outcome"] == "ok" and a.get("constraint_gib", 0) > 0)
    ]
    return len(ran), len(over)


def exported(best_file: Path) -> Key | None:
    """The config a search exported, as the grids name it (None: nothing exported)."""
    if not best_file.exists():
        return None
    best = json.loads(best_file.read_text())
    return (
        best["per_device_train_batch_size"],
        "bf16" if best.get("bf16") else "fp16" if best.get("fp16") else "fp32",
        bool(best.get("activation_checkpointing", best.get("gradient_checkpointing"))),
        best["optim"],
    )


def seeds(
    name: str,
    model_dir: Path,
    work: Path,
    budget: int,
    trials: int,
    prober: Prober | None,
    grid: dict[str, Any],
    keep: str | None,
    *,
    label: str,
    family: str,
) -> list[dict[str, Any]]:
    """One method's searches, a seed each, run for real and scored by the grid's truth."""
    outs = []
    for seed in SEEDS:
        if name == "autotune":
            out = autotune(model_dir, work, budget, trials, seed, keep, LORA.get(family, ""))
        else:
            assert prober is not None, "the plain samplers probe through a Prober"
            out = plain(name, prober, trials, seed)
        out["ratio"] = round(ratio(out["found"], grid), 3)
        out["rule_ratio"] = round(rule_ratio(out["found"], grid), 3)
        outs.append(out)
        print(f"{label or '  '}{name} seed {seed}: {out}", flush=True)
    return outs


def binding_budget(grid: dict[str, Any]) -> int:
    """A budget under which the unconstrained best config is judged not to fit."""
    return int(grid["peaks"][grid["best"]] * 0.98 / 0.95) // MIB * MIB


def recorded_grid(row: dict[str, Any]) -> dict[str, Any]:
    """A setting's grid as families.json recorded it: the first pass's scores (medians,
    where a config was repeated back to back) and the interleaved truth. A row recorded
    before the truth was interleaved has its contenders re-timed by --remeasure; until
    then its best and ties stand as recorded (a range reaching the best's: a tie)."""
    scores = {parse_key(t): statistics.median(v) for t, v in row["grid"].items()}
    if "truth" in row:
        runs = {
            parse_key(t): {r: v for r, v in enumerate(speeds) if v is not None}
            for t, speeds in row["truth"]["rounds"].items()
        }
        return {"scores": scores, "truth": paired(runs)}
    best = tuple(row["best"])
    old = Truth(
        runs={k: {0: v} for k, v in scores.items()},
        best=best,
        ratios={k: v / scores[best] for k, v in scores.items()},
        half_widths={},
        ties=[parse_key("|".join(map(str, k))) for k in row["ties"]],
    )
    return {"scores": scores, "truth": old}


def replay(args: argparse.Namespace, trials: int, work: Path) -> None:
    """autotune alone against grids measured before (--grid): no grid probes, and
    nothing written but stdout. The grid's truth holds only on the machine it was
    measured on, so the recorded machine is printed beside this one."""
    recorded = json.loads(Path(args.grid).read_text())
    print(f"grid of {recorded['date']} on {recorded['machine']}; now {machine()['machine']}")
    if args.co_tenant:
        print(
            f"with a co-tenant: one core busy {args.co_tenant:g} s of every {2 * args.co_tenant:g}"
        )
    with co_tenant(args.co_tenant) if args.co_tenant else contextlib.nullcontext():
        _replay(args, recorded, trials, work)


@contextlib.contextmanager
def co_tenant(busy_s: float) -> Iterator[None]:
    """Another process on the host: it spins one core for `busy_s`, idles as long, and
    so on, until the block ends (this 2-core VM's slow spells, on cue)."""
    spin = (
        "import time\n"
        "while True:\n"
        f"    end = time.monotonic() + {busy_s}\n"
        "    while time.monotonic() < end: pass\n"
        f"    time.sleep({busy_s})\n"
    )
    process = subprocess.Popen([sys.executable, "-c", spin])
    try:
        yield
    finally:
        process.kill()
        process.wait()


def selected(recorded: dict[str, Any], only: str) -> list[dict[str, Any]]:
    """The recorded settings whose 'family, budget' contains `only`."""
    return [r for r in recorded["settings"] if only in f"{r['family']}, {r['budget']}"]


def model_folder(row: dict[str, Any], work: Path) -> Path:
    """A folder holding the setting's model config, for `--model`."""
    folder = work / f"{row['family']}-{row['budget']}".replace(" ", "_")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(FAMILIES[row["family"]]))
    return folder


def _replay(args: argparse.Namespace, recorded: dict[str, Any], trials: int, work: Path) -> None:
    names = args.methods.split(",")
    rows = []
    for row in selected(recorded, args.only):
        model_dir = model_folder(row, work)
        grid = recorded_grid(row)
        plain_samplers = bool(set(names) - {"autotune"})  # they probe as the full run does
        prober = None
        if plain_samplers or args.host_check:
            prober = Prober(
                family_model(row["family"], model_dir), int(row["budget_mib"] * MIB * 0.95), work
            )
        methods: dict[str, list[dict[str, Any]]] = {}
        try:
            if prober is not None and args.host_check:
                print(f"{row['family']}, {row['budget']}: {host_check(prober, grid)}", flush=True)
                if not plain_samplers:  # the searches run alone, as before the check
                    prober.close()
                    prober = None
            for name in names:
                methods[name] = outs = seeds(
                    name,
                    model_dir,
                    work,
                    row["budget_mib"] * MIB,
                    trials,
                    prober,
                    grid,
                    args.keep,
                    label=f"{row['family']}, {row['budget']}: ",
                    family=row["family"],
                )
                ratios = [o["ratio"] for o in outs]
                ruled = [o["rule_ratio"] for o in outs]
                wasted = [o["wasted"] for o in outs if "wasted" in o]
                launched = sum(o["probes"] for o in outs if "wasted" in o)
                print(
                    f"  {name}: against the rule's best mean {statistics.mean(ruled):.3f}, "
                    f"worst {min(ruled):.3f}; against the raw best mean "
                    f"{statistics.mean(ratios):.3f}, worst {min(ratios):.3f}"
                    + (
                        f"; {sum(wasted)} of {launched} probes out of memory or over the limit"
                        if wasted
                        else ""
                    ),
                    flush=True,
                )
        finally:
            if prober is not None:
                prober.close()
        rows.append({**row, "ties": grid["truth"].ties, "methods": methods})
    if len(names) > 1:
        command = f"python benchmarks/families.py --grid {args.grid} --methods {args.methods}"
        print(
            markdown(
                {**recorded, **machine(), "trial_budget": trials, "settings": rows},
                names=names,
                command=command,
            )
        )


HOST_ROUNDS = 2  # paired rounds of the host check
HOST_OFF = 0.15  # a ratio this far (in log) from the grid's: the grid's truth is another host's


def host_check(prober: Prober, grid: dict[str, Any]) -> str:
    """Whether this host runs the setting's configs as the grid's host did: the grid's
    best against the fastest config of the plain arithmetic (fp32 AdamW, the one a tie
    keeps), timed now in HOST_ROUNDS interleaved rounds, their ratio against the grid's.

    A grid's truth holds on the host it was timed on. One day's host, labelled as the
    grid's (a 2-core AMD EPYC), ran the LoRA job's bf16 Adafactor at 0.76 of fp32 AdamW
    where the grid has it 1.2x faster; the replays then scored 0.83 for searches that
    picked right for that host, and nothing said why."""
    truth, scores = grid["truth"], grid["scores"]
    best = truth.best
    plain = [k for k, v in scores.items() if v > 0 and k[1] == "fp32" and k[3] in PLAIN_OPTIM]
    if not plain or best in plain:
        return "host check: the grid's best keeps the plain arithmetic; nothing to compare"
    keeping = max(plain, key=lambda k: scores[k])
    was = truth.ratios.get(keeping) or scores[keeping] / scores[best]
    runs: dict[Key, dict[int, float]] = {}
    for _ in range(HOST_ROUNDS):
        interleaved(prober.speed, [best, keeping], runs)
    rounds = sorted(runs[best])
    now, _, _ = round_ratio([runs[keeping][r] for r in rounds], [runs[best][r] for r in rounds])
    if not now:
        return f"host check: {label(list(best))} did not run within the budget here"
    said = (
        f"host check: {label(list(keeping))} at {now:.2f} of {label(list(best))} now, "
        f"{was:.2f} in the grid"
    )
    if abs(math.log(now / was)) <= HOST_OFF:
        return said
    return (
        f"{said}: THIS HOST DOES NOT RUN THEM AS THE GRID'S DID, the scores below do not "
        "hold here (--regrid times the grid again on it)"
    )


def regrid(args: argparse.Namespace, work: Path) -> None:
    """Measure a recorded setting's whole grid again at its recorded budget, under the
    libraries installed now (which configs fit moves with them: transformers 5.24 holds
    more than 5.23 did), write it into the file in place of the old one, and re-score
    the recorded methods against it (each one's figure before kept as ratio_old_grid).
    Then `--grid` replays autotune against the new grid."""
    path = Path(args.grid)
    recorded = json.loads(path.read_text())
    now = machine()
    print(f"grid of {recorded['date']} on {recorded['machine']}; now {now['machine']}")
    recorded.setdefault("regrids", []).append(
        {
            "date": now["date"],
            "machine": now["machine"],
            "versions": now["versions"],
            "only": args.only,
        }
    )
    for row in selected(recorded, args.only):
        model_dir = model_folder(row, work)
        model = family_model(row["family"], model_dir)
        prober = Prober(model, int(row["budget_mib"] * MIB * 0.95), work)
        try:
            grid = measure_grid(prober)
        finally:
            prober.close()
        row["old_grid"] = {k: row[k] for k in ("fit", "best", "ties", "grid_wall_s") if k in row}
        row.update(
            grid_wall_s=round(grid["wall_s"], 1),
            fit=grid["fit"],
            grid={"|".join(map(str, k)): [round(v, 2)] for k, v in grid["scores"].items()},
            truth={
                **truth_json(grid["truth"]),
                "date": now["date"],
                "dates": [now["date"]],
                "versions": now["versions"],
            },
        )
        row["best_samples_per_s"] = round(
            statistics.median(grid["truth"].runs[grid["best"]].values()), 2
        )
        for outs in row["methods"].values():
            for out in outs:
                out["ratio_old_grid"] = out["ratio"]
        rescore(row)
        print(
            f"{row['family']}, {row['budget']}: {row['fit']} fit (was "
            f"{row['old_grid'].get('fit')}), best {label(row['best'])} (was "
            f"{label(row['old_grid']['best'])}), {row['grid_wall_s']} s",
            flush=True,
        )
        if not args.no_append:  # each setting saved as it is done
            path.write_text(json.dumps(recorded, indent=2) + "\n")


def remeasure(args: argparse.Namespace, work: Path) -> None:
    """Re-time a recorded grid's contenders in interleaved rounds, write the truth into
    the file, and re-score every recorded method against it. A grid recorded back to
    back gets its first interleaved truth (the contenders: the configs near its best and
    every config a method found; the figure a method had is kept as ratio_back_to_back);
    one with an interleaved truth gets another day's rounds, pooled with its own (what
    it said alone is kept as one_day, and each method's figure as ratio_one_day)."""
    path = Path(args.grid)
    recorded = json.loads(path.read_text())
    now = machine()
    print(f"grid of {recorded['date']} on {recorded['machine']}; now {now['machine']}")
    pooling = False
    for row in selected(recorded, args.only):
        model_dir = model_folder(row, work)
        medians = {parse_key(t): statistics.median(v) for t, v in row["grid"].items()}
        top = max(medians.values())
        found = {tuple(o["found"]) for outs in row["methods"].values() for o in outs if o["found"]}
        before = recorded_grid(row)["truth"].runs if "truth" in row else {}
        near = {k for k, v in medians.items() if v >= (1 - REMEASURE_NEAR) * top}
        contenders = sorted((set(before) if before else near) | found)
        model = family_model(row["family"], model_dir)
        prober = Prober(model, int(row["budget_mib"] * MIB * 0.95), work)
        started = time.monotonic()
        try:
            truth = measure(prober.speed, contenders, before)
        finally:
            prober.close()
        if before:
            pooling = True
            row["one_day"] = {k: row["truth"][k] for k in ("best", "ties", "ratios", "date")}
            for outs in row["methods"].values():
                for out in outs:
                    out["ratio_one_day"] = out["ratio"]
        row.setdefault("back_to_back", {"best": row["best"], "ties": row["ties"]})
        old = row.get("truth", {})
        dates = [d for d in old.get("dates", [old.get("date")]) if d] + [now["date"]]
        row["truth"] = {
            **truth_json(truth),
            "date": now["date"],
            "dates": dates,
            "versions": now["versions"],
            "wall_s": round(time.monotonic() - started, 1),
        }
        rescore(row)
        print(
            f"{row['family']}, {row['budget']}: {len(contenders)} contenders,",
            row["truth"],
            flush=True,
        )
        if not args.no_append:  # each setting saved as it is done
            path.write_text(json.dumps(recorded, indent=2) + "\n")
    text = (pooled_markdown if pooling else remeasured_markdown)(recorded, args.only)
    print(text)
    if not args.no_append:
        with open(path.parent / "RESULTS.md", "a", encoding="utf-8") as out:
            out.write(text)


def label(key: list[Any]) -> str:
    """A config in a table cell: "8 bf16 ckpt adafactor"."""
    batch, precision, ckpt, optim = key
    return f"{batch} {precision}{' ckpt' if ckpt else ''} {optim}"


def rescore(row: dict[str, Any]) -> None:
    """Derive a row's truth (best, ties, ratios) from its interleaved rounds and score
    every recorded method against it, keeping the back-to-back figure beside it."""
    grid = recorded_grid(row)
    truth: Truth[Key] = grid["truth"]
    row["truth"].update({k: v for k, v in truth_json(truth).items() if k != "rounds"})
    row["best"], row["ties"] = list(truth.best), [list(k) for k in truth.ties]
    for outs in row["methods"].values():
        for out in outs:
            out.setdefault("ratio_back_to_back", out["ratio"])
            out["ratio"] = round(ratio(out["found"] and tuple(out["found"]), grid), 3)


METHODS = ("autotune", "tpe", "random", "gp")
LABELS = {"autotune": "autotune", "tpe": "plain TPE", "random": "random", "gp": "GP"}


def rescored(rows: list[dict[str, Any]], was: str) -> tuple[list[str], str]:
    """Each row's cells, every method's figure before (`was`, kept beside it) → now as
    mean / worst, and the same over all rows."""
    before: dict[str, list[float]] = {n: [] for n in METHODS}
    after: dict[str, list[float]] = {n: [] for n in METHODS}
    cells = []
    for row in rows:
        changes = []
        for name in METHODS:
            old = [o[was] for o in row["methods"][name]]
            new = [o["ratio"] for o in row["methods"][name]]
            before[name] += old
            after[name] += new
            changes.append(_change(old, new))
        cells.append(" | ".join(changes))
    return cells, " | ".join(_change(before[n], after[n]) for n in METHODS)


def _change(old: list[float], new: list[float]) -> str:
    return (
        f"{statistics.mean(old):.3f} → {statistics.mean(new):.3f} / {min(old):.3f} → {min(new):.3f}"
    )


def remeasured_markdown(recorded: dict[str, Any], only: str) -> str:
    lines = []
    rows = [r for r in selected(recorded, only) if "truth" in r]
    cells, summary = rescored(rows, "ratio_back_to_back")
    for row, methods in zip(rows, cells, strict=True):
        truth = row["truth"]
        best = "|".join(map(str, truth["best"]))
        speeds = [v for v in truth["rounds"][best] if v is not None]
        widths = [w for k, w in truth["half_widths"].items() if k != best and w is not None]
        lines.append(
            f"| {row['family']} | {row['budget']} | {len(truth['rounds'])}, {truth['wall_s']:.0f} s "
            f"| {label(row['back_to_back']['best'])} → {label(truth['best'])} "
            f"({statistics.median(speeds):.1f}/s; "
            f"{f'±{statistics.median(widths):.1%}' if widths else 'alone'}) "
            f"| {len(row['back_to_back']['ties'])} → {len(truth['ties'])} | {methods} |"
        )
    return f"""
## The families' grids re-timed in interleaved rounds ({rows[0]["truth"]["date"]})

Command: `python benchmarks/families.py --grid benchmarks/families.json --remeasure`,
alone; {rows[0]["truth"]["versions"]}. The grids of {recorded["date"]}
repeated a config back to back, so a slow or fast minute of the host decided close
calls. Here the contenders (every config whose recorded median came within
{REMEASURE_NEAR:.0%} of the best's, and every config a method found) are timed once a
round over {GRID_MEASURE} steps, {ROUNDS} rounds (odd rounds in reverse order), and each is
compared with the best (the config the paired ratios put first) round by round: its
ratio is the geometric mean of the paired ratios, with a 95% interval (Student's t);
an interval that reaches 1 is a tie, and a
tie more than 2% below the best gets more rounds, up to 8. The recorded searches are
re-scored against it (nothing re-run): mean → mean / worst → worst, back to back →
interleaved. Contenders: count, wall; best: back to back → interleaved (its median, the
median interval's half width).

| family | budget | contenders | best | ties | autotune | plain TPE | random | GP |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(lines)}
| all | | | | | {summary} |
"""


def pooled_markdown(recorded: dict[str, Any], only: str) -> str:
    """A table of the truth pooled over two days' rounds against one day's, and every
    recorded method re-scored: one day → pooled (mean / worst)."""
    lines = []
    rows = [r for r in selected(recorded, only) if "one_day" in r]
    cells, summary = rescored(rows, "ratio_one_day")
    for row, methods in zip(rows, cells, strict=True):
        truth, day = row["truth"], row["one_day"]
        moved = []
        for key, now in sorted(truth["ratios"].items(), key=lambda kv: -kv[1]):
            was = day["ratios"].get(key)
            if was is not None and abs(now - was) >= 0.02:
                moved.append(f"{label(parse_key(key))} {was:.3f} → {now:.3f}")
        rounds = max(len([v for v in r if v is not None]) for r in truth["rounds"].values())
        lines.append(
            f"| {row['family']} | {row['budget']} | {rounds}, {truth['wall_s']:.0f} s "
            f"| {label(day['best'])} → {label(truth['best'])} "
            f"| {len(day['ties'])} → {len(truth['ties'])} | {'; '.join(moved) or 'none'} "
            f"| {methods} |"
        )
    dates = " and ".join(rows[0]["truth"]["dates"])
    return f"""
## The families' truth timed on a second day, rounds pooled ({rows[0]["truth"]["date"]})

Command: `python benchmarks/families.py --grid benchmarks/families.json --remeasure`,
alone; {rows[0]["truth"]["versions"]}. Every contender of each setting's interleaved
truth timed in {ROUNDS} more interleaved rounds, pooled with the recorded ones (sessions
dated {dates}), then more rounds for unsettled ties as before. Rounds: the most a contender has, and
this run's wall. Moved: the contenders whose ratio to the best moved by 2% or more.
The recorded searches are re-scored (nothing re-run): one day → pooled, mean / worst.

| family | budget | rounds | best | ties | moved | autotune | plain TPE | random | GP |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(lines)}
| all | | | | | | {summary} |
"""


def measure_family(
    family: str, work: Path, names: tuple[str, ...] | list[str], trials: int, keep: str | None
) -> list[dict[str, Any]]:
    """A family's two settings (memory free; a budget under which that grid's best does
    not fit): each grid measured, then each method's searches scored against it."""
    config = FAMILIES[family]
    model_dir = work / family.replace(" ", "_").replace("(", "").replace(")", "")
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config))
    model = family_model(family, model_dir)
    budget = GENEROUS
    rows = []
    for label in ("memory free", "memory binds"):
        prober = Prober(model, int(budget * 0.95), work)
        try:
            grid = measure_grid(prober)
            while grid["fit"] < 3:  # too tight to compare searches: loosen by 10%
                prober.close()
                budget = int(budget * 1.1) // MIB * MIB
                prober = Prober(model, int(budget * 0.95), work)
                grid = measure_grid(prober)
            row: dict[str, Any] = {
                "family": family,
                "budget": label,
                "budget_mib": budget // MIB,
                "grid_wall_s": round(grid["wall_s"], 1),
                "fit": grid["fit"],
                "best": list(grid["best"]),
                "ties": [list(k) for k in grid["truth"].ties],
                "best_samples_per_s": round(
                    statistics.median(grid["truth"].runs[grid["best"]].values()), 2
                ),
                "grid": {"|".join(map(str, k)): [round(v, 2)] for k, v in grid["scores"].items()},
                "truth": truth_json(grid["truth"]),
                "methods": {},
            }
            print(
                f"{family}, {label}: grid",
                {k: v for k, v in row.items() if k != "grid"},
                flush=True,
            )
            for name in names:
                outs = seeds(
                    name,
                    model_dir,
                    work,
                    budget,
                    trials,
                    prober,
                    grid,
                    keep,
                    label="",
                    family=family,
                )
                row["methods"][name] = [
                    {**o, "found": o["found"] and list(o["found"]), "wall_s": round(o["wall_s"], 1)}
                    for o in outs
                ]
            rows.append(row)
        finally:
            prober.close()
        budget = binding_budget(grid)
    return rows


def add(args: argparse.Namespace, trials: int, work: Path) -> None:
    """Measure the families named by --family that a recorded families.json (--add-to)
    lacks, run --methods against their grids, and append them to that file; prints
    their table (the recorded settings are not run again)."""
    path = Path(args.add_to)
    recorded = json.loads(path.read_text())
    have = {r["family"] for r in recorded["settings"]}
    names = args.methods.split(",")
    rows = []
    for family in [f for f in FAMILIES if args.family in f and f not in have]:
        rows += measure_family(family, work, names, trials, args.keep)
        recorded["settings"] += rows[-2:]
        if not args.no_append:
            path.write_text(json.dumps(recorded, indent=2) + "\n")
    if rows:
        command = f"python benchmarks/families.py --add-to {args.add_to} --family '{args.family}'"
        print(markdown({**recorded, **machine(), "settings": rows}, names=names, command=command))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-append", action="store_true", help="do not touch RESULTS.md")
    parser.add_argument(
        "--grid",
        help="score `autotune search` only, against this recorded "
        "families.json (same machine), and write nothing but stdout",
    )
    parser.add_argument(
        "--only",
        default="",
        help="with --grid: settings whose 'family, budget' contains this (e.g. 't5), memory free')",
    )
    parser.add_argument(
        "--methods",
        default="autotune",
        help="with --grid: the methods to run, comma-separated, of "
        + ",".join(METHODS)
        + "; more than one prints the results table",
    )
    parser.add_argument("--keep", help="copy each autotune search's studies/ here")
    parser.add_argument(
        "--no-host-check",
        dest="host_check",
        action="store_false",
        help="with --grid: skip re-timing two of each setting's configs, which checks that "
        "this host runs them as the grid's host did (about 20 s a setting)",
    )
    parser.add_argument(
        "--co-tenant",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --grid: a process spins one core this long, then idles as long, throughout",
    )
    parser.add_argument(
        "--remeasure",
        action="store_true",
        help="with --grid: re-time the recorded grid's contenders in interleaved rounds "
        "(pooled with its own rounds where it has an interleaved truth), write the truth "
        "into that file and re-score its recorded methods",
    )
    parser.add_argument(
        "--regrid",
        action="store_true",
        help="with --grid: measure the selected settings' whole grids again at their "
        "recorded budgets, under the libraries installed now, and write them into that file",
    )
    parser.add_argument(
        "--add-to",
        help="measure the families --family names that this recorded families.json lacks "
        "(their grids, then --methods against them) and append them to it",
    )
    parser.add_argument(
        "--family", default="", help="with --add-to: families whose name contains this"
    )
    args = parser.parse_args()
    if unknown := set(args.methods.split(",")) - set(METHODS):
        parser.error(f"--methods: unknown {', '.join(sorted(unknown))}; of {','.join(METHODS)}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    figures: dict[str, Any] = {
        **machine(),
        "space": len(list(space().candidates())),
        "seeds": list(SEEDS),
        "settings": [],
    }
    trials = max(3, int(figures["space"] * SHARE))
    figures["trial_budget"] = trials
    with tempfile.TemporaryDirectory() as tmp:
        if args.grid and args.remeasure:
            remeasure(args, Path(tmp))
            return
        if args.grid and args.regrid:
            regrid(args, Path(tmp))
            return
        if args.grid:
            replay(args, trials, Path(tmp))
            return
        if args.add_to:
            add(args, trials, Path(tmp))
            return
        for family in FAMILIES:
            rows = measure_family(family, Path(tmp), METHODS, trials, args.keep)
            figures["settings"] += rows
    save("families", figures, markdown(figures), not args.no_append)


def markdown(
    f: dict[str, Any],
    names: list[str] | tuple[str, ...] = METHODS,
    command: str = "python benchmarks/families.py",
) -> str:
    """The section RESULTS.md gets: a run's grids (measured, or recorded and replayed
    against: `command` says which) and each method's figures."""
    lines = []
    for row in f["settings"]:
        cells = []
        for name in names:
            outs = row["methods"][name]
            ratios = [o["rule_ratio"] for o in outs]
            raw = [o["ratio"] for o in outs]
            cells.append(
                f"{statistics.mean(ratios):.3f} / {min(ratios):.3f} "
                f"(raw {statistics.mean(raw):.3f} / {min(raw):.3f}; "
                f"{statistics.mean(o['probes'] for o in outs):.1f} probes, "
                f"{statistics.mean(o['wall_s'] for o in outs):.0f} s)"
            )
        lines.append(
            f"| {row['family']} | {row['budget']} ({row['budget_mib']} MiB; "
            f"{row['fit']} fit) | {row['grid_wall_s']:.0f} s, "
            f"{len(row['ties'])} tied | " + " | ".join(cells) + " |"
        )
    means = {n: [o["rule_ratio"] for r in f["settings"] for o in r["methods"][n]] for n in names}
    summary = " | ".join(f"{statistics.mean(v):.3f} / {min(v):.3f}" for v in means.values())
    return f"""
## Search efficiency across model families and budgets ({f["date"]})

Machine: {f["machine"]}; {f["versions"]}. Command: `{command}`, alone.
Space: {f["space"]} configs (global batch {GLOBAL_BATCH}, {SEQ_LEN} tokens; batch x
{"/".join(PRECISIONS)} x checkpointing x {"/".join(OPTIMIZERS)}). Each method: {f["trial_budget"]}
probes ({f["trial_budget"] / f["space"]:.0%} of the grid's), seeds {f["seeds"]}, run for real.
Grid: every config once over {GRID_MEASURE} timed steps; every config whose run came
within {NEAR:.0%} of the best's, {ROUNDS}+ interleaved rounds paired with the best (_truth).
Cells: mean / worst best-found over the best config the export rule may pick (the best
that keeps fp32 AdamW's arithmetic, or a change of it whose gain the grid's paired rounds
make significant; a config tied with it counts as found), then over the grid's raw best
(the rule's price), then mean probes and wall per search.

| family | budget | grid | {" | ".join(LABELS[n] for n in names)} |
| --- | --- | --- |{" --- |" * len(names)}
{chr(10).join(lines)}
| all | | | {summary} |
"""


if __name__ == "__main__":
    main()
