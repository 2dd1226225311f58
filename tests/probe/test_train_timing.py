"""How a probe turns the steps it timed on the user's own batches into the figures
selection ranks (probe/_train.timed_batches): packed rows counted per token."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import cand

from autotune.core.enums import Outcome
from autotune.core.trial import ModelSpec, TrialResult
from autotune.probe._inputs import Workload
from autotune.probe._train import per_global_batch, timed_batches

MODEL = ModelSpec("llama", "factory", "causal-lm", {"vocab_size": 64})


class Timer:
    def __init__(self, times: list[float]) -> None:
        self.times = times

    def measured_step_times(self) -> list[float]:
        return list(self.times)


class Count:
    def __init__(self, fed: list[tuple[int, int]]) -> None:
        self.counts = fed

    def fed(self) -> list[tuple[int, int]]:
        return list(self.counts)


def work(packed: bool, processes: int = 1) -> Workload:
    candidate = dataclasses.replace(cand(8), gradient_accumulation_steps=1, packing=packed)
    return Workload(MODEL, candidate, {}, seed=0, seq_len=200, target_len=0, processes=processes)


def timed(work: Workload, fed: list[tuple[int, int]]) -> TrialResult:
    """Two timed steps of 1 s over `fed`; packed, the data's samples are 50 tokens long."""
    sample_tokens = 50.0 if work.candidate.packing else 0.0
    return timed_batches(work, 2, sample_tokens, Timer([1.0, 1.0]), Count(fed), WORST)


WORST = TrialResult(Outcome.OK, samples_per_s=4.0, step_time_median_s=2.0)


def test_a_packed_step_counts_as_the_global_batch_at_the_mean_length() -> None:
    """8 rows of 200 tokens hold 32 samples of 50 tokens: a step of 1 s trains four
    global batches of 8, so it ranks as a step of 0.25 s (32 samples/s), the speed of
    the user's samples; their tokens/s stay as trained."""
    fed = [(1600, 1600)] * 3  # the warm-up step, then the two timed ones
    result = timed(work(True), fed)
    assert result.step_times_s == (0.25, 0.25) and result.samples_per_s == pytest.approx(32.0)
    assert result.samples_per_step == 32.0 and result.tokens_per_s == pytest.approx(1600.0)
    # the worst case's full rows count in samples too: 4 rows/s of 200 tokens, 16 samples
    assert result.padding_fraction == 0.0 and result.worst_case_samples_per_s == 16.0
    # unpacked, the step trains the global batch: its time stands as measured
    plain = timed(work(False), [(400, 800)] * 3)
    assert plain.step_times_s == (1.0, 1.0) and plain.samples_per_s == pytest.approx(8.0)
    assert plain.samples_per_step is None and plain.padding_fraction == 0.5
    assert plain.worst_case_samples_per_s == 4.0


def test_each_packed_step_is_scaled_by_its_own_tokens() -> None:
    assert per_global_batch([1.0, 2.0], [800, 1600], 400.0) == [0.5, 0.5]
    assert per_global_batch([1.0], [0], 400.0) == [1.0]  # nothing counted: as measured


def test_a_packed_step_of_two_processes_counts_the_tokens_of_both() -> None:
    """DDP over 2 processes, each packing 8 rows of 200 tokens: a step trains 3200 tokens,
    64 samples of 50, and the global batch is 16 (8 x 1 x 2). A step of 1 s trains four
    global batches, so it ranks as one of 0.25 s (64 samples/s), as with one process;
    the samples a step trains (what the export divides by the global batch) are both
    processes', and so are the tokens a second."""
    fed = [(1600, 1600)] * 3  # one process's count: the warm-up step, then the timed ones
    two = work(True, processes=2)
    assert two.global_batch_size == 16
    result = timed(two, fed)
    assert result.step_times_s == (0.25, 0.25) and result.samples_per_s == pytest.approx(64.0)
    assert result.samples_per_step == 64.0 and result.tokens_per_s == pytest.approx(3200.0)
