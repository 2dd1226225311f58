#!/usr/bin/env python
"""The search's rules against the families' recorded grids, over many seeds, in minutes.

`families.py --grid` replays the real search against the grids, each probe trained for
real: three seeds per setting take a quarter of an hour, and a replay differs run to run
(the probes are measured), so a rule change that moves one seed's pick cannot be told
from the host's noise (BERT with memory binding missed in 5 of 18 real searches, seed 1
in two runs of three). Here the real `autotune search` runs in this process, every rule
of it as shipped (the proposals, the memory verdicts, adaptive measurement's stops, the
confirmation, the duel, selection), but each probe is answered from the grid instead of
trained:

- a config the grid found out of memory is out of memory (its peak the limit);
- a config that fits runs at the grid's speed: a contender's paired ratio to the best
  (the interleaved truth), another's first-pass speed, both on the best's scale; its
  steps each carry noise (NOISE per step, and a spell of SPELL shared by the probe's
  steps: a 2-core host's), fed one by one to the probe's own stopping rule;
- its peak is the search's own memory estimate with its activations scaled by one
  factor a setting, the one that best parts the grid's fitting configs from its out of
  memory ones (the grids keep no peaks), held under the limit.

Each pick is scored as families.py scores a real one: against the best config the
export rule may pick (`families.rule_best`: a change of arithmetic only where the grid's
paired rounds make its gain significant), 1 for a tie, the raw best's ratio beside it.
What it cannot show: the host's real noise (spells longer than a probe, drift over a
search), the memory estimate's real errors, time. It ranks rules; the real replay
checks the one kept.

    python benchmarks/families_simulated.py [--seeds 30] [--only "bert), memory binds"]
    python benchmarks/families_simulated.py --quick  # gpt2 memory free, two seeds
    # a host whose runs of one config drift 8% (the 2-core hosts' read 4-11%), and a
    # rule tried against it through the search's own options:
    python benchmarks/families_simulated.py --spell 0.08 --search-arg=--confirm-rounds=16
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import multiprocessing
import os
import random
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import families
from families import GLOBAL_BATCH, Key, key_of, recorded_grid, selected
from harness import Benchmark, header, run, table

import autotune.search_command as search_command  # calls run_search, which makes a Launcher
import autotune.tuning.run as search_run
from autotune.cli import main as autotune_main
from autotune.core.trial import Candidate, Outcome, TrialConfig, TrialResult
from autotune.probe import Measurement, schedule_of
from autotune.tuning import spec_breakdown
from autotune.tuning.estimate import PROCESS_BYTES

PROBE_LINE = re.compile(r"^(?:trial|confirm)\s+\d+ (?!running|skipped)", re.MULTILINE)
NOISE = 0.03  # sd of one step's log time
SPELL = 0.04  # sd of a probe's log time shared by its steps
UNDER = 0.97  # a fitting config's peak, at most this share of the limit
IDLE = 0.02  # a change of arithmetic that gains less than this over keeping it is idle
HUNG_S = 120.0  # a search running this long has hung (no probe here takes time)
TRIALS = 9  # the families' trial budget (15% of the 60-config grid) where unrecorded


class GridLauncher:
    """Answers the search's probes from a grid: speeds per config, 0 for out of memory."""

    def __init__(self, speeds: dict[Key, float], rng: random.Random, spell: float = SPELL) -> None:
        self.speeds, self.rng, self.spell = speeds, rng, spell
        self.spec: Any = None  # the study's SearchSpec, set as the search starts
        self.scale: float | None = None  # of the estimate's activations (`_peak`)

    def run(
        self, config: TrialConfig, *, timeout_s: float, ready_s: float | None = None
    ) -> TrialResult:
        del timeout_s, ready_s  # Launcher.run's: no child, no clock here
        limit = config.memory_limit_bytes or 0
        speed = self.speeds.get(key_of(config.candidate), 0.0)
        if speed <= 0:
            return TrialResult(
                Outcome.OOM, reason="out of memory (the grid's)", peak_memory_bytes=limit
            )
        steps, stop = self._steps(config, GLOBAL_BATCH / speed)
        median = statistics.median(steps)
        return TrialResult(
            Outcome.OK,
            samples_per_s=GLOBAL_BATCH / median,
            step_time_median_s=median,
            step_time_quiet_s=min(steps),
            step_time_spread=(max(steps) - min(steps)) / median,
            step_times_s=tuple(steps),
            peak_memory_bytes=int(min(self._peak(config.candidate, limit), UNDER * limit)),
            final_loss=1.0,
            loss_finite=True,
            phases_s={"total": sum(steps) + 1.0, "measured_steps": sum(steps)},
            baseline={"rss_bytes": PROCESS_BYTES["cpu"]},
            measure_stop=stop,
            memory_limit_bytes=limit,
            warmup_steps=1,
            one_time_s=0.0,
        )

    def _peak(self, candidate: Candidate, limit: int) -> float:
        """The estimate's peak with its activations scaled by the factor that best
        reproduces which configs the grid found out of memory under `limit`."""
        if self.scale is None:
            needed = {
                key: self._scale_at_limit(families.candidate(key), limit) for key in self.speeds
            }
            fits = [v for k, v in needed.items() if self.speeds[k] > 0]
            ooms = [v for k, v in needed.items() if self.speeds[k] <= 0]
            # the factor misclassifying fewest configs: a fitting one needs at most its
            # own, an out-of-memory one more than its own
            trials = sorted({*fits, *ooms, 1.0})
            wrong = [(sum(f < t for f in fits) + sum(o >= t for o in ooms), t) for t in trials]
            self.scale = min(wrong)[1]
        b = spec_breakdown(self.spec, candidate)
        return (
            PROCESS_BYTES["cpu"] + b.static + max(self.scale * b.activations, b.after_activations)
        )

    def _scale_at_limit(self, candidate: Candidate, limit: int) -> float:
        """The activation factor at which the candidate's estimated peak reaches `limit`."""
        b = spec_breakdown(self.spec, candidate)
        room = limit - PROCESS_BYTES["cpu"] - b.static
        return room / b.activations if b.activations > 0 else math.inf

    def _steps(self, config: TrialConfig, step_s: float) -> tuple[list[float], str]:
        """The probe's measured steps, until its own stopping rule closes the window, and
        why it closed."""
        spell = math.exp(self.rng.gauss(0.0, self.spell))
        plan = Measurement(
            warmup_steps=config.warmup_steps,
            measure_steps=config.measure_steps,
            min_window_s=config.min_measure_s,
            adaptive=config.adaptive,
            incumbent_s=config.incumbent_s,
            train_steps=config.train_steps,
        )
        schedule = schedule_of(plan, config.nproc_per_node)  # as the probe's run_probe
        most = schedule.longest if schedule else config.measure_steps
        steps: list[float] = []
        while len(steps) < max(1, most):
            steps.append(step_s * spell * math.exp(self.rng.gauss(0.0, NOISE)))
            reason = schedule.stop_reason(steps) if schedule else ""
            if reason:
                return steps, reason
        return steps, "full window"

    def close(self) -> None:
        pass


def speeds_of(grid: dict[str, Any]) -> dict[Key, float]:
    """Each config's samples/s on the best's scale: a contender's paired ratio to the
    best, another's first-pass speed scaled as the best's first pass to its rounds."""
    truth, scores = grid["truth"], grid["scores"]
    best_speed = statistics.median(v for v in truth.runs[truth.best].values() if v > 0)
    scale = best_speed / scores[truth.best] if scores.get(truth.best) else 1.0
    speeds = {key: score * scale for key, score in scores.items()}
    for key, ratio in truth.ratios.items():
        if scores.get(key, 0.0) > 0:
            speeds[key] = best_speed * ratio
    return speeds


def idle_change(found: Key | None, speeds: dict[Key, float]) -> bool:
    """Whether the pick changes fp32 AdamW's arithmetic for a gain under IDLE over the
    fastest config that keeps it, as the simulation's speeds have them: the rule's other
    error, a change of the user's training a tie does not pay for. The scores cannot show
    it (a pick tied with the rule's best counts as found)."""
    if found is None or families.keeps_arithmetic(found):
        return False
    keeping = [v for k, v in speeds.items() if v > 0 and families.keeps_arithmetic(k)]
    return bool(keeping) and speeds.get(found, 0.0) < (1 + IDLE) * max(keeping)


@contextlib.contextmanager
def answered_from(launcher: GridLauncher) -> Any:
    """The search's probes answered by `launcher` (its spec set as each search starts)."""
    original = search_command.run_search

    def run_search(**kwargs: Any) -> Any:
        launcher.spec = kwargs["store"].spec
        return original(**kwargs)

    saved = search_run.Launcher, search_command.run_search
    search_run.Launcher = lambda *a, **k: launcher  # type: ignore[assignment,misc]
    search_command.run_search = run_search  # type: ignore[assignment]
    try:
        yield
    finally:
        search_run.Launcher, search_command.run_search = saved  # type: ignore[misc]


def one_search(
    row: dict[str, Any],
    grid: dict[str, Any],
    model_dir: Path,
    seed: int,
    work: Path,
    *,
    show: bool = False,
    spell: float = SPELL,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One search of the setting (`row`, its `grid` as recorded_grid reads it), its
    probes answered from the grid; its pick, scored (`show`: its output printed)."""
    rng = random.Random(f"{row['family']}|{row['budget']}|{seed}")
    launcher = GridLauncher(speeds_of(grid), rng, spell)
    run_dir = Path(tempfile.mkdtemp(dir=work))
    argv = families.search_argv(
        model_dir,
        row["budget_mib"] * families.MIB,
        row["trial_budget"],
        seed,
        families.LORA.get(row["family"], ""),
    )
    argv += ["--no-fork-server", "--no-rehearse", *extra]
    before = os.getcwd()
    os.chdir(run_dir)
    out = io.StringIO()
    try:
        with answered_from(launcher), contextlib.redirect_stdout(out):
            try:
                autotune_main(argv)
            except SystemExit as exc:
                if exc.code:
                    raise RuntimeError(
                        f"search failed ({exc.code}): {out.getvalue()[-600:]}"
                    ) from None
    finally:
        os.chdir(before)
    if show:
        print(out.getvalue())
    found = families.exported(run_dir / "studies" / "bench.best.json")
    probes = len(PROBE_LINE.findall(out.getvalue()))  # confirmations count, as in families
    return {
        "found": found,
        "idle_change": idle_change(found, launcher.speeds),
        "ratio": families.ratio(found, grid),
        "rule_ratio": families.rule_ratio(found, grid),
        "probes": probes,
    }


def searches(
    row: dict[str, Any],
    grid: dict[str, Any],
    model_dir: Path,
    seeds: int,
    work: Path,
    jobs: int,
    spell: float = SPELL,
    extra: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """The setting's searches, `jobs` at a time; a search still running after
    HUNG_S is a hang of the search itself (no probe here takes time): say which."""
    pool = multiprocessing.get_context("fork").Pool(jobs)
    pending = [
        pool.apply_async(
            one_search, (row, grid, model_dir, s, work), {"spell": spell, "extra": extra}
        )
        for s in range(seeds)
    ]
    outs = []
    for seed, result in enumerate(pending):
        try:
            outs.append(result.get(timeout=HUNG_S))
        except multiprocessing.TimeoutError:
            pool.terminate()  # the workers are searches: SIGTERM ends them as it would
            raise SystemExit(
                f"{row['family']}, {row['budget']}, seed {seed}: the search hung "
                f"(--show {seed} prints it)"
            ) from None
    pool.close()  # the workers exit on their own, without a SIGTERM to report
    pool.join()
    return outs


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    recorded = json.loads(Path(args.grid).read_text())
    seeds = 2 if args.quick else args.seeds
    only = "gpt2), memory free" if args.quick else args.only
    print(f"grid of {recorded['date']} on {recorded['machine']}; {seeds} seeds a setting")
    settings = []
    extra = tuple(args.search_arg)
    started = time.monotonic()
    for row in selected(recorded, only):
        row = {**row, "trial_budget": recorded.get("trial_budget", TRIALS)}
        model_dir, grid = families.setting_folder(row, work), recorded_grid(row)
        if args.show is not None:
            shown = one_search(
                row, grid, model_dir, args.show, work, show=True, spell=args.spell, extra=extra
            )
            print(shown)
            continue
        outs = searches(row, grid, model_dir, seeds, work, args.jobs, args.spell, extra)
        ratios = [o["rule_ratio"] for o in outs]
        raw = [o["ratio"] for o in outs]
        missed = {
            families.label(list(o["found"])) for o in outs if o["found"] and o["rule_ratio"] < 0.95
        }
        settings.append(
            {
                "setting": f"{row['family']}, {row['budget']}",
                "rule_best": families.label(list(families.rule_best(grid))),
                "ratios": [round(r, 4) for r in ratios],
                "raw": [round(r, 4) for r in raw],
                "probes": statistics.mean(o["probes"] for o in outs),
                "idle_changes": sum(o["idle_change"] for o in outs),
                "missed_for": sorted(missed),
            }
        )
        print(_line(settings[-1]), flush=True)
    return {
        "grid": args.grid,
        "seeds": seeds,
        "spell": args.spell,
        "search_args": args.search_arg,
        "settings": settings,
        "wall_s": round(time.monotonic() - started),
    }


def _line(s: dict[str, Any]) -> str:
    ratios, raw = s["ratios"], s["raw"]
    return (
        f"{s['setting']}: the rule's best {s['rule_best']}; mean {statistics.mean(ratios):.3f}, "
        f"worst {min(ratios):.3f}, under 0.95 in {sum(r < 0.95 for r in ratios)} of "
        f"{len(ratios)}; against the raw best mean {statistics.mean(raw):.3f}, worst "
        f"{min(raw):.3f}; probes {s['probes']:.1f}; idle changes {s['idle_changes']}"
        + (f"; missed for {', '.join(s['missed_for'])}" if s["missed_for"] else "")
    )


def report(f: dict[str, Any]) -> str:
    text = header(f, "The search's rules against the families' recorded grids, simulated")
    text += (
        f"\nGrids: `{f['grid']}`; {f['seeds']} seeds a setting; a probe's spell sd "
        f"{f.get('spell', SPELL)}; {f['wall_s']} s.\n\n"
    )
    rows = [
        (
            s["setting"],
            s["rule_best"],
            f"{statistics.mean(s['ratios']):.3f} / {min(s['ratios']):.3f}",
            sum(r < 0.95 for r in s["ratios"]),
            f"{statistics.mean(s['raw']):.3f} / {min(s['raw']):.3f}",
            f"{s['probes']:.1f}",
            s.get("idle_changes", ""),
        )
        for s in f["settings"]
    ]
    every = [r for s in f["settings"] for r in s["ratios"]]
    if every:
        under = sum(r < 0.95 for r in every)
        idle = sum(s.get("idle_changes", 0) for s in f["settings"])
        rows.append(("all", "", f"{statistics.mean(every):.3f}", under, "", "", idle))
    columns = (
        "setting",
        "rule's best",
        "mean / worst",
        "under 0.95",
        "raw mean / worst",
        "probes",
        f"idle changes (gain < {IDLE:.0%})",
    )
    return text + table(columns, rows)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grid", default=str(Path(__file__).with_name("families.json")))
    parser.add_argument("--only", default="", help="settings whose 'family, budget' has this")
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument(
        "--spell",
        type=float,
        default=SPELL,
        help=f"sd of a probe's log time its steps share: how far one run of a config "
        f"reads from another (default {SPELL})",
    )
    parser.add_argument(
        "--search-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument to every search, after families.py's (a rule to try: "
        "--search-arg=--confirm-rounds=12)",
    )
    parser.add_argument("--show", type=int, help="print this seed's search of each setting")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="searches at once")


if __name__ == "__main__":
    run(Benchmark("families_simulated", __doc__, measure, report, options))
