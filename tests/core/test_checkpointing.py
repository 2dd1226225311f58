"""Graded activation checkpointing: the levels, what they set, and which are offered."""

from __future__ import annotations

import pytest
from conftest import ROOT

from autotune.core import checkpointing
from autotune.core.checkpointing import Checkpointing
from autotune.core.enums import DeviceKind

FIELD = "activation_checkpointing"


def test_the_levels_run_in_the_order_of_the_memory_they_free() -> None:
    assert [level.value for level in Checkpointing] == [
        "off",
        "every-4",
        "every-2",
        "on",
        "offload",
    ]
    assert [level.rank for level in Checkpointing] == [0, 1, 2, 3, 4]
    assert not Checkpointing.OFF and all(level for level in list(Checkpointing)[1:])
    labels = [level.label for level in Checkpointing]
    assert labels == ["no-ckpt", "ckpt/4", "ckpt/2", "ckpt", "ckpt+offload"]


def test_studies_recorded_before_the_grades_read_their_booleans_as_off_and_on() -> None:
    assert Checkpointing.of(False) is Checkpointing.OFF
    assert Checkpointing.of(True) is Checkpointing.ON
    assert Checkpointing.of("every-2") is Checkpointing.EVERY_2


def test_each_level_sets_the_fields_transformers_reads_and_reads_back_from_them() -> None:
    assert Checkpointing.OFF.arguments(FIELD) == {FIELD: False}
    assert Checkpointing.ON.arguments(FIELD) == {FIELD: True}
    assert Checkpointing.EVERY_4.arguments(FIELD) == {
        FIELD: True,
        f"{FIELD}_kwargs": {"every_n_layers": 4},
    }
    assert Checkpointing.OFFLOAD.arguments(FIELD)[f"{FIELD}_kwargs"] == {"offload": True}
    for level in Checkpointing:
        assert Checkpointing.from_arguments(level.arguments(FIELD), FIELD) is level
    assert Checkpointing.from_arguments({}, FIELD) is Checkpointing.OFF


def test_the_users_own_kwargs_are_kept_beside_the_levels() -> None:
    theirs = {"use_reentrant": True, "every_n_layers": 3}
    fields = Checkpointing.EVERY_2.arguments(FIELD, theirs)
    assert fields[f"{FIELD}_kwargs"] == {"use_reentrant": True, "every_n_layers": 2}
    assert Checkpointing.ON.arguments(FIELD, '{"use_reentrant": true}') == {
        FIELD: True,
        f"{FIELD}_kwargs": {"use_reentrant": True},  # their JSON string, read
    }
    assert Checkpointing.OFF.arguments(FIELD, theirs) == {FIELD: False}
    as_json = {FIELD: True, f"{FIELD}_kwargs": '{"every_n_layers": 4}'}
    assert Checkpointing.from_arguments(as_json, FIELD) is Checkpointing.EVERY_4


def test_layers_are_counted_across_stacks_as_transformers_counts_them() -> None:
    # 6 layers, every 4th: layers 0 and 4 checkpointed, 4 keep their activations
    assert Checkpointing.EVERY_4.kept_layers(0, 6) == 4
    assert Checkpointing.EVERY_2.kept_layers(0, 6) == 3
    assert Checkpointing.ON.kept_layers(0, 6) == 0
    assert Checkpointing.OFF.kept_layers(0, 6) == 6
    # a decoder after a 3-layer encoder: indices 3, 4, 5; every 2nd checkpoints 4 alone
    assert Checkpointing.EVERY_2.kept_layers(3, 3) == 2


def test_a_deep_model_on_a_gpu_is_offered_every_level() -> None:
    levels, why = checkpointing.offered(12, DeviceKind.CUDA)
    assert levels == tuple(Checkpointing) and why == ()


def test_the_cpu_is_not_offered_offload_and_is_told_why() -> None:
    levels, why = checkpointing.offered(12, DeviceKind.CPU)
    assert Checkpointing.OFFLOAD not in levels and len(levels) == 4
    assert "host memory already" in dict(why)["checkpointing offload"]


def test_a_level_that_checkpoints_as_many_layers_as_the_next_is_not_offered() -> None:
    levels, why = checkpointing.offered(2, DeviceKind.CPU)
    assert levels == (Checkpointing.OFF, Checkpointing.EVERY_2, Checkpointing.ON)
    assert dict(why)["checkpointing every-4"] == (
        "the model has 2 layers: it would checkpoint as many as every 2nd"
    )
    one, _ = checkpointing.offered(1, DeviceKind.CPU)
    assert one == (Checkpointing.OFF, Checkpointing.ON)


def test_without_every_n_layers_in_transformers_only_off_and_on_are_offered() -> None:
    levels, why = checkpointing.offered(None, DeviceKind.CUDA)
    assert levels == (Checkpointing.OFF, Checkpointing.ON)
    assert {name for name, _ in why} == {
        "checkpointing every-4",
        "checkpointing every-2",
        "checkpointing offload",
    }


def test_an_unknown_level_is_refused_naming_the_levels() -> None:
    assert checkpointing.parse(["On", "every-2", "on"]) == (
        Checkpointing.ON,
        Checkpointing.EVERY_2,
    )
    with pytest.raises(ValueError, match="choose from off, every-4, every-2, on, offload"):
        checkpointing.parse(["sometimes"])


def test_transformers_grading_keyword_is_written_in_the_declaration_and_the_layer_count() -> None:
    """The level's declaration owns what transformers reads; hf/models counts the layers
    a level grades (on the meta device). Nothing else knows how a level is written."""
    holders = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "autotune").rglob("*.py")
        if "every_n_layers" in path.read_text()
    )
    assert holders == ["autotune/core/checkpointing.py", "autotune/hf/models.py"]


def test_a_job_that_turns_checkpointing_on_itself_is_offered_every_level_but_off() -> None:
    """prepare_model_for_kbit_training turns it on and the Trainer never turns it off:
    off is not offered, with why; off asked alone is refused in one line, off asked with
    others is dropped."""
    levels, why = checkpointing.offered(8, DeviceKind.CPU, forced=True)
    assert Checkpointing.OFF not in levels and Checkpointing.ON in levels
    assert "prepare_model_for_kbit_training" in dict(why)["checkpointing off"]
    assert checkpointing.offered(8, DeviceKind.CPU)[0][0] is Checkpointing.OFF
    with pytest.raises(ValueError, match="--checkpointing off: your factory turns"):
        checkpointing.narrowed(levels, why, ("off",), forced=True)
    assert checkpointing.narrowed(levels, why, ("off", "on"), forced=True) == (Checkpointing.ON,)


def test_a_level_recomputes_the_share_of_layers_it_checkpoints() -> None:
    """What the model of step time expects a level to cost (tuning/_propose.expected)."""
    assert Checkpointing.OFF.recomputed == 0.0
    assert Checkpointing.EVERY_4.recomputed == 0.25
    assert Checkpointing.EVERY_2.recomputed == 0.5
    assert Checkpointing.ON.recomputed == Checkpointing.OFFLOAD.recomputed == 1.0
