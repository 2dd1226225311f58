#!/usr/bin/env python
"""Does the search find the best config in few probes, across model families and memory
budgets? And what does a probe cost?

For each of four small models (a causal LM, the same with a LoRA adapter, a seq2seq
model, an encoder classifier) and two memory budgets (one that leaves the whole space
free, one under which the unconstrained best does not fit), on this machine's CPU:

1. the exhaustive grid: every config of the space probed once under the budget (10
   timed steps), then every config whose run came within 35% of the best's timed again
   in interleaved rounds, each paired with the best round by round (_truth: a ratio
   with a 95% interval; a tie when it reaches 1, and a tie found counts as found);
2. four methods, each with the same trial budget (15% of the grid's probes) and 3
   seeds, each run for real and charged its real probe time, OOM launches included:
   `autotune search` with its defaults (every probe it launches counts, confirmations
   included), and plain Optuna TPE, random and GP samplers driving the same probe
   (fixed windows), each selecting the best of its own measurements.

Every pick is scored against the best config the export rule may pick (the best that
keeps fp32 AdamW's arithmetic, or a change of it whose gain the grid's paired rounds make
significant), and against the grid's raw best. Last, one probe's cost by phase: a fresh
interpreter, the fork server, and the fork server handing down the model it built.

    pip install -e ".[bench]"   # scipy, for the GP sampler
    python benchmarks/families.py --record    # about an hour on 2 cores, alone
    python benchmarks/families.py --quick     # one family, a small space, for the suite
    # autotune only, replayed against the recorded grids (same machine), 3 seeds; each
    # setting first re-times two of its configs and says when this host runs them
    # otherwise than the grid's did (--no-host-check skips it), and after its searches
    # times their picks again beside the rule's best, scored as the host runs them now
    # (--no-verdict skips it):
    python benchmarks/families.py --grid benchmarks/families.json --only "t5), memory free" \
        --keep /tmp/studies
    # every method side by side against the recorded grids (34 min)
    python benchmarks/families.py --grid benchmarks/families.json \
        --methods autotune,tpe,random,gp
    # with a co-tenant that spins one core 15 s of every 30 s: slow spells on cue
    python benchmarks/families.py --grid benchmarks/families.json --co-tenant 15
    # the memory-binds grids measured again under today's libraries (about 20 min), or
    # their contenders timed in 5 more rounds pooled with the recorded ones; --record
    # writes them into families.json, the recorded searches re-scored against them:
    python benchmarks/families.py --grid benchmarks/families.json --only "memory binds" \
        --regrid --record
    python benchmarks/families.py --grid benchmarks/families.json --only "memory binds" \
        --remeasure --record
    # the probe's own memory moves with the host: --rebudget first derives each
    # memory-binds budget again from its memory-free grid's best, as a full run does
    python benchmarks/families.py --grid benchmarks/families.json --only "memory binds" \
        --regrid --rebudget --record
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import optuna
from _truth import ROUNDS, Truth, interleaved, measure, paired, round_ratio
from harness import Benchmark, Figures, autotune, gpt2, header, model_folder, run, score, stamp

from autotune.core.checkpointing import Checkpointing
from autotune.core.space import SearchSpace, batch_choices
from autotune.core.trial import Candidate, ModelSpec, TrialConfig, TrialResult
from autotune.hf.models import resolve_model
from autotune.hf.peft import parse_lora

MIB = 2**20
GENEROUS = 16 * 2**30
GLOBAL_BATCH, SEQ_LEN, TARGET_LEN = 16, 128, 16
WARMUP, MEASURE = 2, 3
PLAIN_OPTIM = ("adamw_torch", "adamw_torch_fused")  # AdamW's arithmetic, fused or not
SHARE = 0.15
NEAR = 0.35  # a config whose first run comes this close to the best's is a contender
SMALL = {"vocab_size": 4096, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
FAMILIES: dict[str, dict[str, Any]] = {
    "causal LM (gpt2)": gpt2(n_layer=4, n_positions=512, **SMALL),
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
METHODS = ("autotune", "tpe", "random", "gp")
LABELS = {"autotune": "autotune", "tpe": "plain TPE", "random": "random", "gp": "GP"}
Key = tuple[int, str, bool, str]


@dataclasses.dataclass(frozen=True)
class Setting:
    """What one run measures: the families and budgets, the space, the methods."""

    families: tuple[str, ...] = tuple(FAMILIES)
    budgets: tuple[str, ...] = ("memory free", "memory binds")
    precisions: tuple[str, ...] = ("fp32", "bf16")
    optimizers: tuple[str, ...] = ("adamw_torch", "adamw_torch_fused", "adafactor")
    checkpointing: tuple[bool, ...] = (False, True)
    methods: tuple[str, ...] = METHODS
    seeds: tuple[int, ...] = (0, 1, 2)
    grid_measure: int = 10  # a grid run's timed steps: the truth is timed longer
    rounds: int = ROUNDS
    probe_cost_repeats: int = 3
    fallback: bool = True  # batches 1, 2, 4 in the space beside 8 and 16

    def candidates(self) -> list[Candidate]:
        return list(self.space().candidates(include_fallback=self.fallback))

    def space(self) -> SearchSpace:
        regular, fallback = batch_choices(GLOBAL_BATCH)
        return SearchSpace(
            GLOBAL_BATCH, regular, fallback, self.precisions, self.checkpointing, self.optimizers
        )

    @property
    def trials(self) -> int:
        return max(3, int(len(self.candidates()) * SHARE))


FULL = Setting()
QUICK = Setting(
    families=("causal LM (gpt2)",),
    budgets=("memory free",),
    precisions=("fp32",),
    optimizers=("adamw_torch", "adafactor"),
    checkpointing=(False,),
    methods=("autotune", "random"),
    seeds=(0,),
    grid_measure=3,
    rounds=2,
    probe_cost_repeats=1,
    fallback=False,
)


def family_model(family: str, model_dir: Path) -> ModelSpec:
    """The family's model as its probes build it: with its LoRA adapter where it has one."""
    model = resolve_model(str(model_dir))
    lora = LORA.get(family)
    return dataclasses.replace(model, adapter=parse_lora(lora)) if lora else model


def key_of(c: Candidate) -> Key:
    """A config as the grids name it: checkpointing off or on as a bool."""
    checkpointed = c.activation_checkpointing != Checkpointing.OFF
    return (c.per_device_train_batch_size, str(c.precision), checkpointed, c.optim)


def candidate(key: Key) -> Candidate:
    batch, precision, ckpt, optim = key
    return Candidate(
        batch, GLOBAL_BATCH // batch, precision, ckpt, optim, attn_implementation="sdpa"
    )


class Prober(harness.Prober):
    """The families' probes of one model under one limit, named by their keys."""

    def __init__(self, model: ModelSpec, limit: int, work: Path) -> None:
        super().__init__(model, work, limit, fields={"seq_len": SEQ_LEN, "target_len": TARGET_LEN})

    def __call__(self, key: Key, measure: int = MEASURE) -> TrialResult:  # type: ignore[override]
        return super().__call__(candidate(key), WARMUP, measure)

    def speed(self, key: Key, measure: int = FULL.grid_measure) -> float:  # type: ignore[override]
        """A grid run's samples/s within the limit (0: did not fit or failed)."""
        return score(self(key, measure), self.limit)


def measure_grid(prober: Prober, setting: Setting) -> dict[str, Any]:
    """The truth, to a stated precision: every config once, then every config whose run
    came within NEAR of the best in interleaved rounds (_truth)."""
    started = time.monotonic()
    steps = setting.grid_measure
    first = {key_of(c): prober(key_of(c), steps) for c in setting.candidates()}
    scores = {k: score(r, prober.limit) for k, r in first.items()}
    top = max(scores.values())
    near = [k for k, s in scores.items() if top > 0 and s >= (1 - NEAR) * top]
    truth = measure(lambda k: prober.speed(k, steps), near, rounds=setting.rounds)
    return {
        "wall_s": time.monotonic() - started,
        "scores": scores,
        "truth": truth,
        "best": truth.best,
        "fit": sum(s > 0 for s in scores.values()),
        "peaks": {k: r.peak_memory_bytes or 0 for k, r in first.items()},
    }


# --- scoring a pick against a grid ---


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
    fitting = [k for k, v in grid["scores"].items() if v > 0]
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


# --- grids as families.json holds them ---


def name_of(key: Key | list[Any]) -> str:
    return "|".join(map(str, key))


def truth_json(truth: Truth[Key]) -> dict[str, Any]:
    last = 1 + max(r for rounds in truth.runs.values() for r in rounds)
    return {
        "rounds": {
            name_of(k): [None if r not in v else round(v[r], 2) for r in range(last)]
            for k, v in truth.runs.items()
        },
        "best": list(truth.best),
        "ties": [list(k) for k in truth.ties],
        "ratios": {name_of(k): round(v, 4) for k, v in truth.ratios.items()},
        "half_widths": {
            name_of(k): None if v == math.inf else round(v, 4) for k, v in truth.half_widths.items()
        },
    }


def parse_key(text: str) -> Key:
    """A grid's config as families.json names it: checkpointing "True"/"False" (grids
    measured while it was a bool), "on"/"off" (since it is graded)."""
    batch, precision, ckpt, optim = text.split("|")
    if ckpt not in ("True", "False", "on", "off"):
        raise ValueError(f"{text}: checkpointing {ckpt!r} is not on/off")
    return (int(batch), precision, ckpt in ("True", "on"), optim)


def recorded_grid(row: dict[str, Any]) -> dict[str, Any]:
    """A setting's grid as families.json records it: the first pass's scores (medians,
    where a config was repeated) and the interleaved truth."""
    runs = {
        parse_key(t): {r: v for r, v in enumerate(speeds) if v is not None}
        for t, speeds in row["truth"]["rounds"].items()
    }
    scores = {parse_key(t): statistics.median(v) for t, v in row["grid"].items()}
    return {"scores": scores, "truth": paired(runs)}


def grid_row(grid: dict[str, Any]) -> dict[str, Any]:
    """A measured grid's fields in a families.json row."""
    truth: Truth[Key] = grid["truth"]
    return {
        "grid_wall_s": round(grid["wall_s"], 1),
        "fit": grid["fit"],
        "best": list(truth.best),
        "ties": [list(k) for k in truth.ties],
        "best_samples_per_s": round(statistics.median(truth.runs[truth.best].values()), 2),
        "grid": {name_of(k): [round(v, 2)] for k, v in grid["scores"].items()},
        "truth": truth_json(truth),
    }


def selected(recorded: dict[str, Any], only: str) -> list[dict[str, Any]]:
    """The recorded settings whose 'family, budget' contains `only`."""
    return [r for r in recorded["settings"] if only in f"{r['family']}, {r['budget']}"]


def setting_folder(row: dict[str, Any], work: Path) -> Path:
    """A folder holding the setting's model config, for `--model`."""
    name = f"{row['family']}-{row['budget']}".replace(" ", "_")
    return model_folder(work, name, FAMILIES[row["family"]])


def label(key: list[Any] | Key) -> str:
    """A config in a table cell: "8 bf16 ckpt adafactor"."""
    batch, precision, ckpt, optim = key
    return f"{batch} {precision}{' ckpt' if ckpt else ''} {optim}"


# --- the methods ---


def plain(name: str, prober: Prober, setting: Setting, seed: int) -> dict[str, Any]:
    """A plain Optuna sampler proposing configs, each probed for real."""
    samplers = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed, n_startup_trials=3, multivariate=True),
        "random": lambda: optuna.samplers.RandomSampler(seed=seed),
        "gp": lambda: optuna.samplers.GPSampler(seed=seed, n_startup_trials=3),
    }
    study = optuna.create_study(direction="maximize", sampler=samplers[name]())
    cs = setting.candidates()
    measured: dict[Key, float] = {}
    started = time.monotonic()

    def objective(trial: optuna.Trial) -> float:
        key = (
            trial.suggest_categorical("batch", sorted({c.per_device_train_batch_size for c in cs})),
            trial.suggest_categorical("precision", list(setting.precisions)),
            trial.suggest_categorical("checkpointing", list(setting.checkpointing)),
            trial.suggest_categorical("optim", list(setting.optimizers)),
        )
        value = score(prober(key), prober.limit)
        measured[key] = max(measured.get(key, 0.0), value)
        return value

    study.optimize(objective, n_trials=setting.trials)
    best = max(measured, key=lambda k: measured[k])
    return {
        "found": best if measured[best] > 0 else None,
        "probes": setting.trials,
        "wall_s": time.monotonic() - started + prober.start_s,
    }


def search_argv(
    model_dir: Path, budget: int, trials: int, seed: int, lora: str = "", setting: Setting = FULL
) -> list[str]:
    """`autotune search`'s arguments as the families run it: its defaults, the families'
    space and probe lengths, `trials` probes in all (the confirmation included), parity
    off (the grids time speed alone)."""
    checkpointing = ",".join("on" if c else "off" for c in setting.checkpointing)
    return [
        *("search", "--model", str(model_dir), *(["--lora", lora] if lora else [])),
        *("--device", "cpu", "--study", "bench", "--memory-budget", f"{budget // MIB}MiB"),
        *("--seed", str(seed), "--global-batch-size", str(GLOBAL_BATCH)),
        *("--seq-len", str(SEQ_LEN), "--target-len", str(TARGET_LEN)),
        *("--precisions", ",".join(setting.precisions)),
        *("--optimizers", ",".join(setting.optimizers), "--checkpointing", checkpointing),
        *("--lever", "torch_compile=false", "--lever", "attn_implementation=sdpa"),
        *("--warmup-steps", str(WARMUP), "--measure-steps", str(MEASURE)),
        *("--max-trials", str(trials - 2), "--confirm-top", "1", "--parity", "off"),
        *("--no-reuse", "--quiet"),
    ]


def autotune_search(
    row: dict[str, Any], model_dir: Path, work: Path, seed: int, setting: Setting, keep: str
) -> dict[str, Any]:
    """`autotune search` with its defaults, in a fresh folder (nothing to reuse); with
    `keep`, its studies/ are copied to keep/<model>-<budget>-seed<seed>."""
    budget = row["budget_mib"] * MIB
    run_dir = Path(tempfile.mkdtemp(dir=work))
    lora = LORA.get(row["family"], "")
    started = time.monotonic()
    done = autotune(run_dir, *search_argv(model_dir, budget, setting.trials, seed, lora, setting))
    wall = time.monotonic() - started
    if keep:
        shutil.copytree(run_dir / "studies", Path(keep) / f"{model_dir.name}-seed{seed}")
    probes, wasted = probe_counts(run_dir / "studies")
    return {
        "found": exported(run_dir / "studies" / "bench.best.json") if not done.returncode else None,
        "probes": probes,
        "wasted": wasted,
        "wall_s": wall,
        "exit": done.returncode,
        "stderr": done.stderr[-400:] if done.returncode else "",
    }


def probe_counts(studies: Path) -> tuple[int, int]:
    """(probes a search launched, confirmations included; of them, those that ran out of
    memory or peaked over the limit: launches the memory estimate could have spared)."""
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
    row: dict[str, Any],
    model_dir: Path,
    work: Path,
    prober: Prober | None,
    grid: dict[str, Any],
    args: argparse.Namespace,
    setting: Setting,
) -> list[dict[str, Any]]:
    """One method's searches of a setting (`row`), a seed each, run for real and scored
    against the grid."""
    outs = []
    for seed in setting.seeds:
        if name == "autotune":
            out = autotune_search(row, model_dir, work, seed, setting, args.keep)
        else:
            assert prober is not None, "the plain samplers probe through a Prober"
            out = plain(name, prober, setting, seed)
        out["ratio"] = round(ratio(out["found"], grid), 3)
        out["rule_ratio"] = round(rule_ratio(out["found"], grid), 3)
        out["wall_s"] = round(out["wall_s"], 1)
        outs.append({**out, "found": out["found"] and list(out["found"])})
        print(f"{row['family']}, {row['budget']}: {name} seed {seed}: {out}", flush=True)
    return outs


# --- the modes: measured, replayed, measured again ---


def measure_family(
    family: str, work: Path, args: argparse.Namespace, setting: Setting
) -> list[dict[str, Any]]:
    """A family's settings (memory free; a budget under which that grid's best does not
    fit): each grid measured, then each method's searches scored against it."""
    folder = family.replace(" ", "_").replace("(", "").replace(")", "")
    model_dir = model_folder(work, folder, FAMILIES[family])
    model = family_model(family, model_dir)
    budget = GENEROUS
    rows = []
    for name in setting.budgets:
        while True:
            with Prober(model, int(budget * 0.95), work) as prober:
                grid = measure_grid(prober, setting)
                if grid["fit"] < 3:  # too tight to compare searches: loosen by 10%
                    budget = int(budget * 1.1) // MIB * MIB
                    continue
                row = {"family": family, "budget": name, "budget_mib": budget // MIB}
                row.update(grid_row(grid))
                print(f"{family}, {name}: grid {row['fit']} fit, best {row['best']}", flush=True)
                row["methods"] = {
                    m: seeds(m, row, model_dir, work, prober, grid, args, setting)
                    for m in setting.methods
                }
                break
        rows.append(row)
        budget = int(grid["peaks"][grid["best"]] * 0.98 / 0.95) // MIB * MIB
    return rows


def replay(args: argparse.Namespace, recorded: dict[str, Any], work: Path) -> Figures:
    """The methods against the grids measured before: no grid probes. A grid's truth
    holds only on the host it was timed on: the host check says when this one differs,
    and the verdict times each setting's picks again beside the rule's best, right after
    its searches."""
    names = tuple(args.methods.split(","))
    rows = []
    for row in selected(recorded, args.only):
        model_dir, grid = setting_folder(row, work), recorded_grid(row)
        model = family_model(row["family"], model_dir)
        plain_samplers = bool(set(names) - {"autotune"})  # they probe as the full run does
        limit = int(row["budget_mib"] * MIB * 0.95)
        methods = {}
        with contextlib.ExitStack() as stack:
            prober = None
            if plain_samplers or args.host_check:
                prober = stack.enter_context(Prober(model, limit, work))
            if prober is not None and args.host_check:
                print(f"{row['family']}, {row['budget']}: {host_check(prober, grid)}", flush=True)
                if not plain_samplers:  # the searches run alone, as before the check
                    stack.close()
            for name in names:
                methods[name] = seeds(name, row, model_dir, work, prober, grid, args, FULL)
        rows.append({**row, "ties": grid["truth"].ties, "methods": methods})
        del rows[-1]["grid"], rows[-1]["truth"]
        if args.verdict:
            with Prober(model, limit, work) as prober:
                rows[-1]["verdict"] = verdict(prober, grid, methods)
    return {"grids_of": recorded["date"], "methods": names, "settings": rows}


def verdict(prober: Prober, grid: dict[str, Any], methods: dict[str, list[Any]]) -> dict[str, Any]:
    """Each pick scored against the rule's best as the host runs them now. A replay's
    searches run hours after their grid was timed, and this host's bf16 edge moves within
    the hour (gpt2's fp32 AdamW at 0.83 of bf16 in a grid, 0.96 an hour later): a search
    that reads a tie in its own rounds and keeps fp32 is right for the host it ran on and
    scored a miss against the grid. So right after a setting's searches, their picks, the
    grid's best, its rule's best and its best keeping the arithmetic are timed in
    interleaved rounds (_truth.measure, as the grid's contenders were), and each pick is
    scored by the same rule against the best of these now (`now_ratio`, set on each
    search). This re-times the grid's candidates only: a config no pick and no grid
    favoured is not searched for again, and the host check still says whether the grid
    holds here."""
    started = time.monotonic()
    picks = [tuple(o["found"]) for outs in methods.values() for o in outs if o["found"]]
    scores = grid["scores"]
    keeping = [k for k, v in scores.items() if v > 0 and keeps_arithmetic(k)]
    rivals = {grid["truth"].best, rule_best(grid)}
    if keeping:
        rivals.add(max(keeping, key=lambda k: ratio(k, grid)))
    keys = sorted(rivals | set(picks))
    if len(keys) == 1:  # every pick is the rule's best: nothing to time against it
        for outs in methods.values():
            for out in outs:
                out["now_ratio"] = 1.0 if out["found"] else 0.0
        return {"rule_best": list(keys[0]), "wall_s": 0.0}
    truth = measure(prober.speed, keys)
    now = {"scores": {k: statistics.median(v.values()) for k, v in truth.runs.items()}}
    now["truth"] = truth
    for outs in methods.values():
        for out in outs:
            out["now_ratio"] = round(rule_ratio(out["found"] and tuple(out["found"]), now), 3)
    print(f"verdict: rule's best now {label(rule_best(now))}", flush=True)
    return {
        "rule_best": list(rule_best(now)),
        "wall_s": round(time.monotonic() - started, 1),
        **truth_json(truth),
    }


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


HOST_ROUNDS = 2  # paired rounds of the host check
HOST_OFF = 0.15  # a ratio this far (in log) from the grid's: the grid's truth is another host's


def host_check(prober: Prober, grid: dict[str, Any]) -> str:
    """Whether this host runs the setting's configs as the grid's host did: the grid's
    best against the fastest config of the plain arithmetic, timed now in HOST_ROUNDS
    interleaved rounds, their ratio against the grid's. (One day's host ran the LoRA
    job's bf16 Adafactor at 0.76 of fp32 AdamW where the grid has it 1.2x faster.)"""
    truth, scores = grid["truth"], grid["scores"]
    best = truth.best
    plain = [k for k, v in scores.items() if v > 0 and keeps_arithmetic(k)]
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
        return f"host check: {label(best)} did not run within the budget here"
    said = f"host check: {label(keeping)} at {now:.2f} of {label(best)} now, {was:.2f} in the grid"
    if abs(math.log(now / was)) <= HOST_OFF:
        return said
    return (
        f"{said}: THIS HOST DOES NOT RUN THEM AS THE GRID'S DID, the scores below do not "
        "hold here (--regrid times the grid again on it)"
    )


def again(args: argparse.Namespace, recorded: dict[str, Any], work: Path) -> Figures:
    """The selected settings' grids measured again at their recorded budgets (--regrid),
    or their contenders timed in more rounds pooled with the recorded ones (--remeasure);
    every recorded search re-scored against the new truth. Returns the whole record."""
    now = stamp()
    for row in selected(recorded, args.only):
        model = family_model(row["family"], setting_folder(row, work))
        started = time.monotonic()
        if args.rebudget and row["budget"] == "memory binds":
            rebudget(row, model, recorded, work)
        with Prober(model, int(row["budget_mib"] * MIB * 0.95), work) as prober:
            if args.regrid:
                row.update(grid_row(measure_grid(prober, FULL)))
                dates = [now["date"]]
            else:
                before = recorded_grid(row)["truth"].runs
                outs = [o for outs in row["methods"].values() for o in outs if o["found"]]
                contenders = sorted(set(before) | {tuple(o["found"]) for o in outs})
                dates = [*row["truth"].get("dates", []), now["date"]]
                row["truth"] = truth_json(measure(prober.speed, contenders, before))
        row["truth"].update(dates=dates, date=now["date"], versions=now["versions"])
        row["truth"]["wall_s"] = round(time.monotonic() - started, 1)
        print(f"{row['family']}, {row['budget']}: {row['truth']}", flush=True)
        rescore(row)
    if args.regrid:
        regrid = {"date": now["date"], "only": args.only, "rebudget": args.rebudget}
        recorded.setdefault("regrids", []).append(regrid)
    kept = {k: v for k, v in recorded.items() if k not in now}  # today's stamp, not the grid's
    return {**kept, "only": args.only, "methods": list(recorded["settings"][0]["methods"])}


def binding_mib(model: ModelSpec, best: Key, work: Path) -> int:
    """The budget of a setting where memory binds, as a full run sets it: just under the
    peak of the memory-free grid's best, probed now, so that it does not fit."""
    with Prober(model, int(GENEROUS * 0.95), work) as prober:
        result = prober(best, FULL.grid_measure)
    if not result.peak_memory_bytes:
        raise SystemExit(f"{label(best)} did not run with memory free: {result.reason}")
    return int(result.peak_memory_bytes * 0.98 / 0.95) // MIB


def rebudget(row: dict[str, Any], model: ModelSpec, recorded: dict[str, Any], work: Path) -> None:
    """A memory-binds row's budget derived again from its family's memory-free best on
    this host. The probe's own memory moves with the host: t5's 669 MiB fit its grid's
    best (8 bf16 AdamW, 178 samples/s) on 2026-11-28, and nothing past batch 2 (71) a
    day later, under the same libraries. Its recorded searches ran under the old budget
    and are dropped with it."""
    free = next(r for r in recorded["settings"] if r["family"] == row["family"] and r is not row)
    was = row["budget_mib"]
    row["budget_mib"] = binding_mib(model, parse_key(name_of(free["best"])), work)
    row["methods"] = {}
    print(f"{row['family']}, {row['budget']}: {was} MiB -> {row['budget_mib']} MiB", flush=True)


def rescore(row: dict[str, Any]) -> None:
    """A row's best and ties as its truth's rounds tell them, and every recorded search
    scored against them."""
    grid = recorded_grid(row)
    row["best"], row["ties"] = list(grid["truth"].best), [list(k) for k in grid["truth"].ties]
    for outs in row["methods"].values():
        for out in outs:
            found = out["found"] and tuple(out["found"])
            out["ratio"] = round(ratio(found, grid), 3)
            out["rule_ratio"] = round(rule_ratio(found, grid), 3)


# --- what a probe costs ---


def probe_cost(work: Path, repeats: int) -> dict[str, dict[str, float]]:
    """Mean seconds per phase of one probe, and its quickest step: a fresh interpreter, the
    fork server, and the fork server handing down the model it built (as a search does).
    The launches are interleaved, so that what slows the host slows each alike."""
    from autotune.launch.forkserver import ForkServer
    from autotune.launch.runner import run_trial
    from autotune.probe.shared_model import SharedModel

    model = resolve_model(str(model_folder(work, "probe-cost", FAMILIES["causal LM (gpt2)"])))
    plain = Candidate(8, 1, "fp32", False, "adamw_torch")
    servers: dict[str, ForkServer | None] = {
        "fresh process (before)": None,
        "fork server (after)": ForkServer(work / "oh.log", data_limit=2**31),
        "fork server, model inherited": ForkServer(
            work / "oh-shared.log", data_limit=2**31, shared=SharedModel.of(model, 0, plain)
        ),
    }
    runs: dict[str, list[TrialResult]] = {mode: [] for mode in servers}
    try:
        for i in range(repeats):
            for k, (mode, server) in enumerate(servers.items()):
                config = TrialConfig(
                    number=i,
                    trial_dir=str(work / "oh" / str(k) / str(i)),
                    model=model,
                    candidate=plain,
                    device="cpu",
                    seq_len=128,
                    target_len=8,
                    memory_limit_bytes=2**31,
                    warmup_steps=2,
                    measure_steps=3,
                )
                runs[mode].append(run_trial(config, timeout_s=300, server=server))
    finally:
        for server in servers.values():
            if server is not None:
                server.close()
    phases = {}
    for mode, results in runs.items():
        mean = {
            k: statistics.mean(r.phases_s.get(k, 0.0) for r in results) for k in results[0].phases_s
        }
        mean["start+teardown"] = mean["wall"] - mean["total"]
        mean["quickest_step"] = min(min(r.step_times_s) for r in results)
        phases[mode] = {k: round(v, 3) for k, v in mean.items()}
    return phases


# --- the benchmark ---

PHASES = ("import", "build", "warmup", "measured_steps", "peak_flops", "wall")


def measure_all(args: argparse.Namespace, work: Path) -> Figures:
    if args.grid:
        recorded = json.loads(Path(args.grid).read_text())
        print(f"grids of {recorded['date']} on {recorded['machine']}; now {stamp()['machine']}")
        if args.rebudget and not args.regrid:
            raise SystemExit("--rebudget derives a grid's budget again: give --regrid with it")
        if args.regrid or args.remeasure:
            return {"mode": "measured again", **again(args, recorded, work)}
        if args.record:
            raise SystemExit("a replay writes nothing: --record would replace the grids")
        with co_tenant(args.co_tenant) if args.co_tenant else contextlib.nullcontext():
            return {
                "mode": "replayed",
                "co_tenant_s": args.co_tenant,
                **replay(args, recorded, work),
            }
    setting = QUICK if args.quick else FULL
    figures: Figures = {
        "mode": "measured",
        "space": len(setting.candidates()),
        "seeds": list(setting.seeds),
        "trial_budget": setting.trials,
        "methods": setting.methods,
        "settings": [],
    }
    for family in setting.families:
        figures["settings"] += measure_family(family, work, args, setting)
    figures["probe_cost_s"] = probe_cost(work, setting.probe_cost_repeats)
    return figures


def report(f: Figures) -> str:
    text = header(f, f"Search efficiency across model families and budgets, {f['mode']}")
    if f.get("co_tenant_s"):
        text += f"\nA co-tenant spun one core {f['co_tenant_s']:g} s of every {2 * f['co_tenant_s']:g}.\n"
    text += (
        "\nCells: mean / worst best-found over the export rule's best (a config tied with it "
        "counts as found); in a replay, then over the rule's best as the host runs them now "
        "(the picks timed again beside the grid's candidates right after the setting's "
        "searches); then over the grid's raw best, then mean probes and wall.\n\n"
    )
    rows = []
    for row in selected(f, f.get("only", "")):
        cells = []
        for name in f["methods"]:
            outs = row["methods"].get(name)
            if not outs:
                cells.append("")
                continue
            ruled, raw = [o["rule_ratio"] for o in outs], [o["ratio"] for o in outs]
            now = [o["now_ratio"] for o in outs if "now_ratio" in o]
            timed = f"now {statistics.mean(now):.3f} / {min(now):.3f}; " if now else ""
            cells.append(
                f"{statistics.mean(ruled):.3f} / {min(ruled):.3f} "
                f"({timed}raw {statistics.mean(raw):.3f} / {min(raw):.3f}; "
                f"{statistics.mean(o['probes'] for o in outs):.1f} probes, "
                f"{statistics.mean(o['wall_s'] for o in outs):.0f} s)"
            )
        setting = f"{row['budget']} ({row['budget_mib']} MiB; {row['fit']} fit)"
        grid = f"{row['grid_wall_s']:.0f} s, {len(row['ties'])} tied"
        rows.append((row["family"], setting, grid, *cells))
    means = [
        [o["rule_ratio"] for r in selected(f, f.get("only", "")) for o in r["methods"].get(n, [])]
        for n in f["methods"]
    ]
    nows = [
        [
            o["now_ratio"]
            for r in selected(f, f.get("only", ""))
            for o in r["methods"].get(n, [])
            if "now_ratio" in o
        ]
        for n in f["methods"]
    ]
    cells = (
        f"{statistics.mean(v):.3f} / {min(v):.3f}"
        + (f" (now {statistics.mean(t):.3f} / {min(t):.3f})" if t and len(t) == len(v) else "")
        if v
        else ""
        for v, t in zip(means, nows, strict=True)
    )
    rows.append(("all", "", "", *cells))  # a regrid whose budget moved has no searches
    columns = ("family", "budget", "grid", *(LABELS[n] for n in f["methods"]))
    text += harness.table(columns, rows)
    if "probe_cost_s" in f:
        text += "\nOne probe's cost, seconds (mean of the interleaved launches):\n\n"
        columns = ("start+teardown", *PHASES, "quickest_step")
        costs = [
            (m, *(f"{p.get(k, 0):.2f}" for k in columns)) for m, p in f["probe_cost_s"].items()
        ]
        text += harness.table(("launch", *columns), costs)
    return text


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grid", help="replay against this recorded families.json (same machine)")
    parser.add_argument(
        "--only", default="", help="with --grid: settings whose 'family, budget' contains this"
    )
    parser.add_argument(
        "--methods",
        default="autotune",
        type=lambda text: ",".join(_method(m) for m in text.split(",")),
        help=f"with --grid: the methods to run, of {','.join(METHODS)}",
    )
    parser.add_argument("--keep", default="", help="copy each autotune search's studies/ here")
    parser.add_argument(
        "--no-host-check",
        dest="host_check",
        action="store_false",
        help="with --grid: skip re-timing two of each setting's configs first (about 20 s)",
    )
    parser.add_argument(
        "--no-verdict",
        dest="verdict",
        action="store_false",
        help="with --grid: skip timing each setting's picks again beside the rule's best "
        "after its searches (2-3 minutes a setting)",
    )
    parser.add_argument(
        "--co-tenant",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --grid: a process spins one core this long, then idles as long, throughout",
    )
    again = parser.add_mutually_exclusive_group()
    again.add_argument(
        "--regrid",
        action="store_true",
        help="with --grid: measure the selected whole grids again at their recorded budgets",
    )
    parser.add_argument(
        "--rebudget",
        action="store_true",
        help="with --regrid: derive a memory-binds grid's budget again from its memory-free "
        "grid's best, probed now (the recorded searches under the old budget are dropped)",
    )
    again.add_argument(
        "--remeasure",
        action="store_true",
        help="with --grid: time the selected grids' contenders in more rounds, pooled",
    )


def _method(name: str) -> str:
    if name not in METHODS:
        raise argparse.ArgumentTypeError(f"unknown method {name!r}; of {','.join(METHODS)}")
    return name


if __name__ == "__main__":
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    run(Benchmark("families", __doc__, measure_all, report, options))
