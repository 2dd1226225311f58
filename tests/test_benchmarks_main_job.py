"""The main job's benchmark (benchmarks/main_job.py): which command it times, and how a
selected config is scored against the recorded grid."""

from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from harness import readme_main_job
from main_job import FIXTURE, NOT_SPACE, TUNED, ratio, without


def test_the_timed_command_is_the_readmes_and_the_grid_is_kept_across_budget_changes() -> None:
    flags = readme_main_job()
    assert "--study" not in flags and flags[:2] == ["--model", "google/mt5-small"]
    budget = flags.index("--time-budget")
    other = [*flags[:budget], "--time-budget", "99m", *flags[budget + 2 :], "--quiet"]
    assert without(other, NOT_SPACE) == without(flags, NOT_SPACE)
    assert "--time-budget" not in without(flags, NOT_SPACE)
    narrowed = [*flags, "--precisions", "fp32"]
    assert without(narrowed, NOT_SPACE) != without(flags, NOT_SPACE)


def test_the_readmes_job_gives_the_workload_and_a_time_budget_and_the_plan_does_the_rest() -> None:
    """At most five options, --time-budget among them; the recorded grid is the space of
    the hand-tuned command the README's job is compared with."""
    import json

    flags = readme_main_job()
    options = [word for word in flags if word.startswith("--")]
    assert len(options) <= 5 and "--time-budget" in options, options
    assert json.loads(FIXTURE.read_text())["flags"] == without(TUNED, NOT_SPACE)


def test_a_selected_config_scores_by_the_grids_truth() -> None:
    grid = {
        "first_pass": {"a": 5.0, "b": 4.6, "c": 4.0, "d": 2.0},
        "truth": {
            "best": "a",
            "ties": ["a", "b"],
            "ratios": {"a": 1.0, "b": 0.98, "c": 0.9},
            "rounds": {"a": [5.0, 5.2, 4.8], "b": [4.9, 5.0, 4.7], "c": [4.5, 4.6, 4.4]},
        },
    }
    assert ratio("b", grid) == 1.0  # a tie with the best counts as found
    assert ratio("c", grid) == 0.9  # a contender: its paired ratio
    assert ratio("d", grid) == 2.0 / 5.0  # the rest: its first run over the best's median
    assert ratio("never measured", grid) == 0.0
