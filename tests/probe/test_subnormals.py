"""Subnormal numbers on the CPU: what a job makes of them, read from its optimizer's state,
and what this CPU pays for them."""

from __future__ import annotations

import types

import pytest
import torch

from autotune.core.subnormals import SHARE
from autotune.probe import subnormals

TINY = torch.finfo(torch.float32).tiny


def test_the_timed_inputs_are_subnormal_and_their_cost_a_ratio() -> None:
    """The doctor's check times what it says: every input nonzero and below float32's
    smallest normal number."""
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * subnormals.SCALE
    assert bool((x != 0).all()) and float(x.abs().max()) < TINY
    median, low, high = subnormals.slowdown(seconds=0.05, size=64)
    assert 0 < low <= median <= high < float("inf")


def test_the_share_is_of_every_number_each_tensor_weighted_by_its_size() -> None:
    """A large tensor read at a sample still counts for its size: a tenth of a million
    numbers subnormal beside a thousand normal ones and a million zeros (numbers, not
    subnormal ones) is about a twentieth. A tensor laid out transposed, as AdamW's state
    of a transposed weight is, reads the same."""
    generator = torch.Generator().manual_seed(0)
    large = torch.randn(1_000_000, generator=generator)
    tenth = torch.rand(1_000_000, generator=generator) < 0.1
    large[tenth] *= subnormals.SCALE
    small = torch.randn(10, 100, generator=generator)
    zeros = torch.zeros(1_000_000)
    found = subnormals.share([large, small, zeros])
    assert found == pytest.approx(0.1 * 1_000_000 / 2_001_000, rel=0.05)
    transposed = large.reshape(1000, 1000).t()
    assert not transposed.is_contiguous()
    assert subnormals.share([transposed]) == pytest.approx(0.1, rel=0.05)


def test_a_sample_is_read_without_copying_the_tensor_whole() -> None:
    """Under the probe's memory limit a copy of an LM head's state could fail the run: a
    transposed tensor is read through a view of its own storage, and one no order of its
    dimensions makes dense (a strided slice) is passed over."""
    weight = torch.randn(300, 200).t()
    assert subnormals._flat(weight).data_ptr() == weight.data_ptr()
    sliced = torch.randn(300, 200)[:, ::2]
    assert subnormals._flat(sliced) is None and subnormals.share([sliced]) is None


def test_only_numbers_a_cpu_computes_as_subnormal_count() -> None:
    """fp16's subnormals are normal in the fp32 a CPU computes them in; integers and
    Adam's one-number step counter are not state worth reading; bf16 shares fp32's range."""
    below = torch.full((100,), 1e-39)
    assert subnormals.share([below.to(torch.bfloat16)]) == 1.0
    assert subnormals.share([torch.full((100,), 1e-6, dtype=torch.float16)]) is None
    assert subnormals.share([torch.ones(100, dtype=torch.int64), torch.tensor(1e-39)]) is None
    assert subnormals.share([]) is None


def test_a_trainers_optimizer_state_is_read_and_the_cpu_timed_only_where_it_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Gradients of about 1e-38 leave Adam's first moment subnormal (a tenth of each) and
    its second zero (their squares underflow): half the state. Normal gradients leave
    none, and then the CPU is not timed."""

    class Trained:
        def __init__(self, scale: float) -> None:
            weight = torch.nn.Parameter(torch.randn(64, 64))
            weight.grad = torch.randn(64, 64) * scale
            self.optimizer = torch.optim.Adam([weight])
            self.optimizer.step()

    monkeypatch.setattr(subnormals, "slowdown", lambda seconds: (3.0, 2.0, 4.0))
    assert subnormals.in_optimizer(Trained(1e-38)) == (pytest.approx(0.5, abs=0.01), 3.0)
    monkeypatch.setattr(subnormals, "slowdown", lambda seconds: pytest.fail("timed"))
    assert subnormals.in_optimizer(Trained(1.0)) == (0.0, None)
    assert subnormals.in_optimizer(object()) == (None, None)  # no optimizer: not measured
    assert SHARE < 0.5


def test_a_reading_that_fails_leaves_the_probes_result_as_measured() -> None:
    """Whatever the reading meets (an optimizer state of another shape, an allocation
    refused under the memory limit), the probe's figures stand, without the reading."""
    from autotune.core.enums import Outcome
    from autotune.core.trial import TrialResult
    from autotune.probe._train import with_subnormals

    odd = types.SimpleNamespace(optimizer=types.SimpleNamespace(state=5))  # no .values()
    measured = TrialResult(Outcome.OK, samples_per_s=10.0)
    phases: dict[str, float] = {}
    result = with_subnormals(measured, odd, True, phases)
    assert result == measured.replace(subnormal_share=None, subnormal_slowdown=None)
    assert "subnormals" in phases
