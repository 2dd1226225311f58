"""A local model's config.json (`--model ./dir`) with bad content, generated: a one-line
ModelConfigError naming the file or the model, or a model built from it; never a
traceback, never the file changed."""

from __future__ import annotations

from pathlib import Path

import pytest
from bad_files import bad_content, examples, one_line
from conftest import TINY_GPT2
from hypothesis import given

from autotune.core.errors import UsageError
from autotune.hf.models import count_parameters, max_positions, resolve_model


def _model(folder: Path, content: bytes) -> Path:
    (folder / "model").mkdir(exist_ok=True)
    (folder / "model" / "config.json").write_bytes(content)
    return folder / "model"


@examples(80)
@given(content=bad_content(TINY_GPT2))
def test_a_model_config_is_built_or_refused_in_one_line(tmp_path: Path, content: bytes) -> None:
    folder = _model(tmp_path, content)
    try:
        spec = resolve_model(str(folder))
        count_parameters(spec)
        max_positions(spec.config)
    except UsageError as exc:  # ModelConfigError among them
        assert one_line(str(exc)) and str(folder) in str(exc), str(exc)
    assert (folder / "config.json").read_bytes() == content


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[" * 5000 + b"]" * 5000, "is not valid JSON (nested deeper than can be read)"),
        (b'{"n_embd": ' + b"9" * 5000 + b"}", "is not valid JSON (a number has more digits"),
    ],
    ids=["deep", "long"],
)
def test_a_config_too_deep_or_too_long_to_parse_is_not_valid_json(
    tmp_path: Path, content: bytes, message: str
) -> None:
    """Found by the generated cases: RecursionError and int()'s digit limit escaped."""
    folder = _model(tmp_path, content)
    with pytest.raises(UsageError) as info:
        resolve_model(str(folder))
    assert message in str(info.value) and one_line(str(info.value))


@pytest.mark.parametrize("architectures", [float("nan"), 3, {"a": 1}])
def test_architectures_that_are_no_list_say_nothing_of_the_task(
    tmp_path: Path, architectures: object
) -> None:
    """Found by the generated cases: `for arch in NaN` raised a TypeError."""
    import json

    folder = _model(tmp_path, json.dumps({**TINY_GPT2, "architectures": architectures}).encode())
    assert resolve_model(str(folder)).task == "causal-lm"  # from its model_type


@pytest.mark.parametrize("key", ["n_layer", "num_hidden_layers"])
def test_a_config_of_more_layers_than_can_be_built_is_refused_at_once(
    tmp_path: Path, key: str
) -> None:
    """Found by the generated cases: n_layer 2**63 hung the search, building layer after
    layer on the meta device."""
    import json

    folder = _model(tmp_path, json.dumps({**TINY_GPT2, key: 2**63}).encode())
    with pytest.raises(UsageError, match=f"its config's {key} is {2**63}, more than") as info:
        resolve_model(str(folder))
    assert one_line(str(info.value))
