"""The levers as dimensions of the space: enumerated, sized, stored, resumed, claimed."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import DIMENSIONS, SPACE, SPEC

from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate
from autotune.store._coordination import claim_key
from autotune.store._params import candidate_of, candidate_params, distributions

LEVERED = dataclasses.replace(
    SPACE,
    levers=(
        ("torch_compile", (False, True)),
        ("attn_implementation", ("sdpa", "eager")),
        ("use_liger_kernel", (False,)),
    ),
    not_offered=(("use_liger_kernel", "liger-kernel is not installed"),),
)


def test_every_combination_of_the_searched_levers_is_a_candidate() -> None:
    candidates = list(LEVERED.candidates(include_fallback=False))
    assert len(candidates) == LEVERED.size == SPACE.size * 4
    assert len(set(candidates)) == len(candidates)
    assert {(c.torch_compile, c.attn_implementation) for c in candidates} == {
        (False, "sdpa"),
        (False, "eager"),
        (True, "sdpa"),
        (True, "eager"),
    }
    assert not any(c.use_liger_kernel for c in candidates)


def test_a_candidate_named_without_levers_is_the_plain_run() -> None:
    """The first value of each lever: the model's own attention, no compilation."""
    plain = LEVERED.candidate(8, "fp32", False, "adamw_torch")
    assert (plain.torch_compile, plain.attn_implementation) == (False, "sdpa")
    assert plain.describe() == "batch 8x8 fp32 no-ckpt adamw_torch sdpa"
    compiled = LEVERED.candidate(8, "fp32", False, "adamw_torch", torch_compile=True)
    assert "compiled" in compiled.describe()
    assert compiled.family != plain.family  # memory differs: OOMs do not carry over


def test_levers_are_trial_params_only_where_the_space_varies_them() -> None:
    found = distributions(LEVERED)
    assert "torch_compile" in found and "attn_implementation" in found
    assert "use_liger_kernel" not in found  # one value: not a dimension
    assert "torch_compile" not in distributions(SPACE)
    for candidate in LEVERED.candidates(include_fallback=False):
        assert candidate_of(LEVERED, candidate_params(candidate, LEVERED)) == candidate


def test_a_spec_with_levers_round_trips_and_a_study_from_before_resumes() -> None:
    spec = dataclasses.replace(SPEC, space=LEVERED, train_steps=1000)
    again = SearchSpec.from_json(spec.to_json())
    assert again == spec
    # no levers: the identity is the one studies made before levers existed recorded
    assert "levers" not in SPEC.identity()["space"]
    assert "not_offered" not in spec.identity()["space"]
    assert "train_steps" not in spec.identity()  # a rerun may ask for another run length
    assert spec.identity()["space"]["levers"] != SPEC.identity()["space"].get("levers")


def test_configs_that_differ_only_in_a_lever_are_claimed_apart() -> None:
    plain = LEVERED.candidate(8, "fp32", False, "adamw_torch")
    eager = LEVERED.candidate(8, "fp32", False, "adamw_torch", attn_implementation="eager")
    compiled = LEVERED.candidate(8, "fp32", False, "adamw_torch", torch_compile=True)
    assert len({claim_key(plain), claim_key(eager), claim_key(compiled)}) == 3
    # a config without levers keeps the key studies recorded before levers existed
    assert claim_key(Candidate(8, 8, "fp32", False, "adamw_torch")) == "8|fp32|False|adamw_torch"


def test_an_unknown_lever_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown lever"):
        dataclasses.replace(SPACE, levers=(("zero_offload", (False, True)),))


def test_every_setting_of_a_candidate_is_in_its_claim_key() -> None:
    """Two workers must never take two configs for one: each dimension and lever away
    from its plain value changes the key another worker checks."""
    plain = SPACE.candidate(8, "fp32", False, "adamw_torch")
    keys = {claim_key(plain)}
    for name, (_, other) in DIMENSIONS.items():
        keys.add(claim_key(dataclasses.replace(plain, **{name: other})))
    assert len(keys) == len(DIMENSIONS) + 1


def test_a_study_of_checkpointing_off_and_on_resumes_as_it_was_recorded() -> None:
    """Before the levels, checkpointing was a bool: a space of off and on alone keeps
    the identity, params and claim keys those studies hold; graded ones name levels."""
    assert SPEC.identity()["space"]["checkpointing"] == [False, True]
    assert distributions(SPACE)["activation_checkpointing"].choices == (False, True)
    on = SPACE.candidate(8, "fp32", True, "adamw_torch")
    assert candidate_params(on, SPACE)["activation_checkpointing"] is True
    assert candidate_of(SPACE, {**candidate_params(on, SPACE)}) == on
    graded = dataclasses.replace(SPACE, checkpointing=("off", "every-2", "on"))
    spec = dataclasses.replace(SPEC, space=graded)
    assert list(spec.identity()["space"]["checkpointing"]) == ["off", "every-2", "on"]
    half = graded.candidate(8, "fp32", "every-2", "adamw_torch")
    assert candidate_params(half, graded)["activation_checkpointing"] == "every-2"
    assert candidate_of(graded, candidate_params(half, graded)) == half
    assert claim_key(half) == "8|fp32|every-2|adamw_torch"
    assert SearchSpec.from_json(spec.to_json()) == spec


def test_a_packed_candidate_trains_full_rows_and_the_row_length_is_the_studys() -> None:
    """Packing searched: a packed candidate's worst case (the estimate's length, its
    probe's) is a full row of the user's max_length, the others' their longest sample;
    its steps count in samples of the data's mean length; another max_length is
    another study."""
    space = dataclasses.replace(SPACE, levers=(("packing", (False, True)),))
    assert space.changes_samples and not SPACE.changes_samples
    lengths = {"lengths": {"longest": 120, "samples": 100, "tokens": 6000}}
    spec = dataclasses.replace(SPEC, space=space, packed_len=512, job_profile=lengths)
    packed = space.candidate(8, "fp32", False, "adamw_torch", packing=True)
    assert spec.trained_len(packed) == 512
    assert spec.trained_len(space.candidate(8, "fp32", False, "adamw_torch")) == SPEC.seq_len
    assert spec.sample_tokens == 60.0 and SPEC.sample_tokens == 0.0
    assert spec.identity()["packed_len"] == 512 and "packed_len" not in SPEC.identity()
    assert SearchSpec.from_json(spec.to_json()) == spec
