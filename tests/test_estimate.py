from __future__ import annotations

import pytest

from autotune.errors import UsageError
from autotune.estimate import OPTIMIZER_STATE_BYTES, ModelSize, check_budget, count_parameters
from autotune.models import resolve_model

GIB = 2**30


def test_parameter_count_of_presets_without_allocating() -> None:
    # gpt2 as published: 124,439,808 parameters (tied embeddings).
    assert count_parameters(resolve_model("gpt2")).parameters == 124_439_808


def test_static_bytes_follow_the_published_rule() -> None:
    size = ModelSize(1_000_000)
    assert size.static_bytes("adamw_torch") == 16 * 10**6  # 4 weights + 4 grads + 8 state
    assert size.static_bytes("adamw_torch") - size.static_bytes("adamw_bnb_8bit") == 6 * 10**6
    assert OPTIMIZER_STATE_BYTES["adafactor"] == 4


def test_budget_below_the_weights_is_refused_with_the_estimate() -> None:
    with pytest.raises(UsageError, match=r"below the 3\.7 GiB the fp32 weights alone need"):
        check_budget(ModelSize(10**9), ("adamw_torch",), 2 * GIB)


def test_budget_that_only_an_8bit_optimizer_meets_says_so() -> None:
    size = ModelSize(100_000_000)  # adamw 1.6 GB, 8-bit 1.0 GB, adafactor 1.2 GB
    with pytest.raises(UsageError, match=r"--optimizers adamw_bnb_8bit,adamw_torch_8bit"):
        check_budget(size, ("adamw_torch",), int(1.1e9))
    check_budget(size, ("adamw_torch", "adamw_bnb_8bit"), int(1.1e9))  # one fits: fine
