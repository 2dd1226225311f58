"""Each optimizer is one declaration: the defaults, the estimate's figures, the skip
rule's order, parity's class and the installed list follow from it."""

from __future__ import annotations

from transformers.training_args import OptimizerNames

from autotune.core import optimizers
from autotune.core.optimizers import DECLARED, DEFAULT, DEFAULT_STATE_BYTES, optimizer
from autotune.core.parity import Arithmetic
from autotune.core.trial import Candidate
from autotune.hf.training_args import available_optimizers
from autotune.tuning.estimate import floor_bytes, optimizer_state, state_bytes, step_bytes


def test_every_declared_optimizer_is_one_transformers_knows() -> None:
    known = {o.value for o in OptimizerNames}
    assert {o.name for o in DECLARED} <= known
    assert optimizers.NOT_HERE <= known


def test_the_defaults_are_the_declared_defaults_in_their_order() -> None:
    assert DEFAULT == (
        "adamw_torch",
        "adamw_torch_fused",
        "adafactor",
        "adamw_bnb_8bit",
        "adamw_torch_8bit",
    )
    assert optimizers.FOR_QUANTIZED_BASE == (
        "adamw_bnb_8bit",
        "paged_adamw_8bit",
        "paged_adamw_32bit",
    )


def test_the_floor_never_states_more_than_the_plan() -> None:
    """The floor skips with no margin: an optimizer's certain state is at most what the
    estimate plans for it, and an unmeasured one's floor is nothing."""
    for declared in DECLARED:
        assert declared.floor_bytes <= declared.state(), declared.name
        if declared.state_bytes is None:
            assert declared.floor_bytes == 0 and declared.name not in optimizers.MEASURED


def test_an_optimizer_said_lighter_holds_no_more_at_its_step() -> None:
    """State and the step's temporaries together, up to a largest tensor of half the
    parameters (mT5-small's shared embedding is 0.74 of them: 128M of 172M)."""
    parameters = 10**6
    for heavier in DECLARED:
        for name in heavier.lighter:
            lighter = optimizer(name)
            assert name in optimizers.BY_NAME
            for kind in ("cpu", "cuda"):
                for largest in (parameters // 100, parameters // 2, parameters * 3 // 4):
                    held = [
                        o.state() * parameters + o.step_temporaries(parameters, largest, kind)
                        for o in (lighter, heavier)
                    ]
                    assert held[0] <= held[1], (name, heavier.name, kind, largest)


def test_the_estimate_reads_each_declaration() -> None:
    assert state_bytes("adamw_torch") == 8 and state_bytes("adafactor") == 1
    # bitsandbytes' 8-bit Adam keeps 32-bit state for embeddings
    assert optimizer_state(100, "adamw_bnb_8bit", embedding=40) == 60 * 2 + 40 * 8
    assert step_bytes(1000, 100, "adamw_torch", "cuda") == 4000
    assert step_bytes(1000, 100, "adamw_torch", "cpu") == 800
    assert step_bytes(1000, 100, "adamw_torch_fused", "cuda") == 0
    # paged: the state may sit in host memory, so the floor counts none of it
    paged = Candidate(8, 1, "fp32", False, "paged_adamw_8bit")
    plain = Candidate(8, 1, "fp32", False, "adamw_torch")
    assert floor_bytes(100, paged) == 100 * 4 * 2
    assert floor_bytes(100, plain) == 100 * (4 * 2 + 8)


def test_one_not_declared_is_planned_as_adamw_and_is_its_own_arithmetic() -> None:
    assert state_bytes("sgd_sophia") == DEFAULT_STATE_BYTES
    assert step_bytes(1000, 100, "sgd_sophia", "cuda") == 0
    own = Arithmetic.of(Candidate(8, 1, "fp32", False, "sgd_sophia"))
    assert own.optimizer == "sgd_sophia"


def test_fused_adamw_is_adamws_arithmetic() -> None:
    fused = Arithmetic.of(Candidate(8, 1, "bf16", False, "adamw_torch_fused"))
    assert fused == Arithmetic.of(Candidate(8, 1, "bf16", False, "adamw_torch"))
    assert [o.name for o in DECLARED if o.same_update_as] == ["adamw_torch_fused"]


def test_the_installed_list_holds_what_needs_no_package_and_nothing_that_runs_elsewhere() -> None:
    installed = available_optimizers()
    assert {o.name for o in DECLARED if not o.package} <= set(installed)
    assert not optimizers.NOT_HERE & set(installed)
