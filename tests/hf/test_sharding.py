"""The ZeRO config a stage exports and the FSDP config a mode exports: what the user's
script reads, on the command line or from the arguments file, and what it splits across
processes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from autotune.core.enums import DeviceKind, Precision
from autotune.core.errors import UsageError
from autotune.core.levers import FSDP_MODES, deepspeed_config, fsdp_config, shards
from autotune.core.trial import Candidate
from autotune.hf.sharding import deepspeed_stage
from autotune.hf.training_args import TUNED, cli_flags, tuned_arguments, validate


def test_a_stage_exports_a_config_the_trainer_completes_and_no_optimizer_of_its_own() -> None:
    for stage in (1, 2, 3):
        config = deepspeed_config(stage)
        assert config["zero_optimization"]["stage"] == stage
        assert "optimizer" not in config  # the candidate's optimizer is the one sharded
        autos = [k for k, v in config.items() if v == "auto"]
        assert set(autos) == {
            "train_micro_batch_size_per_gpu",
            "train_batch_size",
            "gradient_accumulation_steps",
            "gradient_clipping",
        }
        assert config["zero_optimization"]["reduce_bucket_size"] == "auto"  # not 2 GB
    assert "stage3_prefetch_bucket_size" in deepspeed_config(3)["zero_optimization"]
    # the user's save_model writes full weights, not only ZeRO's shards
    assert deepspeed_config(3)["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"]
    assert (
        "stage3_gather_16bit_weights_on_model_save" not in deepspeed_config(2)["zero_optimization"]
    )
    with pytest.raises(ValueError, match="stages are 1, 2 and 3"):
        deepspeed_config(0)


def test_only_a_zero_candidate_writes_deepspeed_and_a_users_own_config_is_carried() -> None:
    plain = Candidate(8, 2, Precision.BF16, False, "adamw_torch")
    assert "deepspeed" not in tuned_arguments(plain, device_kind=DeviceKind.CPU)
    zero = Candidate(8, 2, Precision.BF16, False, "adamw_torch", zero_stage=2)
    args = tuned_arguments(zero, device_kind=DeviceKind.CPU)
    assert deepspeed_stage(args) == 2 and zero.describe().endswith(" zero2")
    assert "deepspeed" not in TUNED  # a --base-args deepspeed config is the user's, kept
    assert deepspeed_stage({"deepspeed": "ds_config.json"}) == 0  # a path: not ours to read


def test_the_command_line_form_parses_back_to_the_same_config() -> None:
    pytest.importorskip("deepspeed")  # TrainingArguments reads the config with it
    from transformers import HfArgumentParser, TrainingArguments

    zero = Candidate(8, 2, Precision.FP32, False, "adamw_torch", zero_stage=3)
    args = tuned_arguments(zero, device_kind=DeviceKind.CPU)
    words = shlex.split(cli_flags({"deepspeed": args["deepspeed"]}))
    parser = HfArgumentParser(TrainingArguments)  # type: ignore[arg-type]
    (parsed,) = parser.parse_args_into_dataclasses(
        [*words, "--output_dir", "x", "--use_cpu", "true"]
    )
    assert parsed.deepspeed == json.loads(json.dumps(args["deepspeed"]))
    validate({**args, "output_dir": "x"}, error=UsageError, where="test")


def test_each_stage_splits_one_more_kind_of_state() -> None:
    assert shards(0, 4) == (1, 1, 1)
    assert shards(1, 4) == (1, 1, 4)  # optimizer state
    assert shards(2, 4) == (1, 4, 4)  # and gradients
    assert shards(3, 4) == (4, 4, 4)  # and weights


@pytest.mark.parametrize("mode", list(FSDP_MODES))
def test_an_fsdp_mode_exports_the_fields_the_trainer_reads_as_fsdp2(mode: str) -> None:
    """The arguments file's fields and the command line's flags parse back, through
    HfArgumentParser, to FSDP2 with the mode's resharding and offload, the layers
    wrapped as the model declares them, and a save that writes the full weights."""
    from transformers import HfArgumentParser, TrainingArguments

    candidate = Candidate(8, 2, Precision.BF16, False, "adamw_torch", fsdp_mode=mode)
    args = tuned_arguments(candidate, device_kind=DeviceKind.CUDA)
    assert "deepspeed" not in args and "fsdp" not in TUNED  # a user's own fsdp is carried
    assert args["fsdp_config"] == fsdp_config(mode)
    parser = HfArgumentParser(TrainingArguments)  # type: ignore[arg-type]
    words = shlex.split(cli_flags({k: args[k] for k in ("fsdp", "fsdp_config")}))
    (from_flags,) = parser.parse_args_into_dataclasses([*words, "--output_dir", "x"])
    (from_file,) = parser.parse_dict({**args, "output_dir": "x", "use_cpu": True, "bf16": False})
    for parsed in (from_flags, from_file):
        assert parsed.fsdp_config["version"] == 2
        assert parsed.fsdp_config["reshard_after_forward"] == (mode != "shard_grad_op")
        assert parsed.fsdp_config["cpu_offload"] == (mode == "offload")
        assert parsed.fsdp_config["state_dict_type"] == "FULL_STATE_DICT"
        assert parsed.fsdp_config["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    with pytest.raises(ValueError, match="modes are full_shard, shard_grad_op, offload"):
        fsdp_config("hybrid_shard")


def test_a_build_that_waits_on_a_lock_an_interrupted_one_left_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's build lock stays where a build was killed, and every later build waits on
    it for ever: a search timing the build out says which lock, in its one line."""
    import subprocess

    from autotune.hf import sharding

    def too_long(*args: object, **kwargs: object) -> None:
        raise subprocess.TimeoutExpired("build", sharding.BUILD_TIMEOUT_S)

    monkeypatch.setattr(sharding.subprocess, "run", too_long)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    with pytest.raises(UsageError) as plain:
        sharding.build_cpu_op()
    assert "lock" not in str(plain.value) and "--lever zero_stage=0" in str(plain.value)
    lock = tmp_path / "py311_cpu" / sharding.OP / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    with pytest.raises(UsageError) as held:
        sharding.build_cpu_op()
    said = str(held.value)
    assert f"waiting on the build lock {lock}" in said and "delete it" in said
    assert "\n" not in said
