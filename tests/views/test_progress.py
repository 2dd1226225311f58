"""What a user watching a search sees: the count of probes and the time left."""

from __future__ import annotations

import io

from helpers import SPEC, cand
from rich.console import Console

from autotune.core.enums import Outcome
from autotune.core.trial import TrialResult
from autotune.tuning.deadline import Deadline
from autotune.tuning.limits import SearchLimits
from autotune.views.progress import Progress, time_left, trial_line

LIMITS = SearchLimits(max_trials=10, confirm_top=2)


def test_time_left_counts_the_probes_still_allowed_and_the_confirmations() -> None:
    assert time_left([], 0, LIMITS, None) is None  # nothing to go on before a probe
    # 4 done of 10 at 60 s each: 6 more, plus 2 finalists x 2 runs x 1.5 probe lengths.
    assert time_left([50.0, 70.0], 4, LIMITS, None) == 6 * 60 + 2 * 2 * 60 * 1.5
    assert time_left([60.0], 4, LIMITS, 100.0) == 100.0  # never past the time budget


def test_each_probe_line_says_which_probe_of_how_many_and_warns_when_long() -> None:
    out = io.StringIO()
    progress = Progress(Console(file=out, width=200), live=False, deadline=Deadline.after(None))
    progress.on_search_start(SPEC, "s", SearchLimits(max_trials=80, confirm_top=3), done=2)
    progress.on_trial_start(7, cand(16))
    slow = TrialResult(
        Outcome.OK, samples_per_s=1.0, peak_memory_bytes=2**30, phases_s={"wall": 60.0}
    )
    progress.on_trial_end(7, cand(16), slow)
    progress.on_trial_start(8, cand(32))
    text = out.getvalue()
    assert "probe 3 of 80" in text and "probe 4 of 80, about" in text
    assert "note: at 1m00s a probe, this search will take about" in text
    assert "--time-budget" in text


def test_a_reused_trial_says_where_it_was_measured() -> None:
    reused = TrialResult(Outcome.OK, samples_per_s=10.0, reused_from="study a trial 3")
    assert trial_line(7, cand(8), reused).endswith("(reused: study a trial 3 measured it)")
    oom = TrialResult(Outcome.OOM, reason="out of memory", reused_from="study a trial 4")
    assert trial_line(8, cand(32), oom).endswith(
        "(reused: study a trial 4 measured it; out of memory)"
    )


def test_a_reason_with_brackets_is_printed_as_it_reads() -> None:
    """A child's error may hold a path or torch's '[enforce fail at ...]': rich took them
    as markup, dropping the one and failing the whole search on the other."""
    out = io.StringIO()
    progress = Progress(Console(file=out, width=200), live=False, deadline=Deadline.after(None))
    progress.on_search_start(SPEC, "s", LIMITS)
    reason = "exit code 1; no result.json; OSError: [Errno 2] no file [/tmp/data/x.json]"
    progress.on_trial_end(3, cand(16), TrialResult(Outcome.ERROR, reason=reason))
    oom = "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0"
    progress.on_confirm(3, cand(16), TrialResult(Outcome.ERROR, reason=oom))
    assert reason in out.getvalue() and oom in out.getvalue()
