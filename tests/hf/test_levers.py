"""Each lever's availability rule on this CPU, the reason kept for each one not offered,
and the one-batch check that padding-free batches leave the loss alone."""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

import pytest
from conftest import TINY_GPT2, TINY_T5

from autotune.core.enums import DeviceKind
from autotune.core.errors import UsageError
from autotune.core.job import JobFacts
from autotune.core.trial import Candidate, ModelSpec
from autotune.hf._packing import losses, packing_error
from autotune.hf.levers import offer, parse_lever_options
from autotune.hf.training_args import tuned_arguments
from autotune.views.export import script_changes

GPT2 = ModelSpec("gpt2", "local", "causal-lm", TINY_GPT2)
T5 = ModelSpec("t5", "local", "seq2seq", TINY_T5)
LLAMA = ModelSpec(
    "llama",
    "local",
    "causal-lm",
    {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 512,
    },
)
OPT = ModelSpec(
    "opt",
    "local",
    "causal-lm",
    {
        "model_type": "opt",
        "architectures": ["OPTForCausalLM"],
        "hidden_size": 64,
        "ffn_dim": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 512,
        "word_embed_proj_dim": 64,
    },
)


def offered(
    model: ModelSpec, *, dataset: bool = False, **kw: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    levers, reasons = offer(
        model, DeviceKind.CPU, dataset=dataset, fixed=kw.pop("fixed", {}), asked=kw.pop("asked", {})
    )
    return dict(levers), dict(reasons)


def test_on_this_cpu_compile_and_the_attention_kernels_are_searched() -> None:
    levers, reasons = offered(GPT2)
    assert levers["torch_compile"] == (False, True)  # g++ is here
    assert levers["attn_implementation"] == ("sdpa", "eager")  # the model's default first
    assert "flash-attn" in reasons["attn_implementation"]
    assert "use_liger_kernel" not in levers  # Triton kernels: never on the CPU
    assert reasons["use_liger_kernel"].startswith(
        ("liger-kernel is not installed", "liger kernels are Triton kernels")
    )
    assert (
        reasons["fsdp_mode"] == "FSDP shards across processes: it needs --nproc-per-node 2 or more"
    )
    assert (
        "--dataset" in reasons["padding_free"] and "--dataset" in reasons["dataloader_num_workers"]
    )


def test_without_a_compiler_compilation_is_not_offered_and_show_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    levers, reasons = offered(GPT2)
    assert "torch_compile" not in levers
    assert "C++ compiler" in reasons["torch_compile"]


def test_flex_attention_is_not_offered_on_the_cpu_where_it_has_no_backward() -> None:
    levers, reasons = offered(T5)
    assert "flex_attention" not in levers["attn_implementation"]
    assert "no backward pass on the CPU" in reasons["attn_implementation"]


def test_flex_attention_is_offered_on_a_gpu_only_to_models_without_attention_dropout() -> None:
    """transformers' flex attention raises in training on any attention dropout: mT5 (0.1
    by default) failed its flex probe on an H100. The config's defaults count."""

    def on_gpu(model: ModelSpec) -> tuple[tuple[Any, ...], str]:
        levers, reasons = offer(model, DeviceKind.CUDA, dataset=False, fixed={}, asked={})
        return dict(levers)["attn_implementation"], dict(reasons).get("attn_implementation", "")

    assert "flex_attention" in on_gpu(LLAMA)[0]  # attention_dropout 0.0 by default
    choices, why = on_gpu(T5)
    assert "flex_attention" not in choices and "attention dropout (dropout_rate = 0.1)" in why
    dropping = ModelSpec("llama", "local", "causal-lm", {**LLAMA.config, "attention_dropout": 0.1})
    choices, why = on_gpu(dropping)
    assert "flex_attention" not in choices and "(attention_dropout = 0.1)" in why


def test_with_data_a_causal_lm_that_keeps_packed_sequences_apart_gets_padding_free() -> None:
    for model in (GPT2, LLAMA):
        levers, _ = offered(model, dataset=True)
        assert levers["padding_free"] == (False, True), model.name
        assert levers["dataloader_num_workers"][0] == 0
    _, reasons = offered(T5, dataset=True)
    assert "causal LMs" in reasons["padding_free"]


def test_padding_free_batches_are_refused_where_they_change_the_loss() -> None:
    padded, flat = losses(LLAMA)
    assert flat == pytest.approx(padded, rel=1e-5)
    padded, flat = losses(OPT)  # OPT's attention lets packed sequences see each other
    assert abs(flat - padded) > 1e-4
    assert "does not keep packed sequences apart" in packing_error(OPT)
    levers, reasons = offered(OPT, dataset=True)
    assert "padding_free" not in levers and "change the loss" in reasons["padding_free"]


def sft_job(**changed: Any) -> JobFacts:
    """What the survey reads off an SFTTrainer job: TRL's collator, no packing, data
    whose longest sample (120 tokens) is under max_length (1024, SFTConfig's default),
    a model loaded with flash attention."""
    facts = JobFacts(
        args_class="trl.SFTConfig",
        args_fields=("output_dir", "max_length", "packing", "padding_free"),
        model_name="llama",
        model_class="LlamaForCausalLM",
        task="causal-lm",
        config=LLAMA.config,
        parameters=1,
        trainable=1,
        embedding=0,
        largest=1,
        longest=120,
        max_length=1024,
        collator="trl.trainer.sft_trainer.DataCollatorForLanguageModeling",
        attention="flash_attention_2",
    )
    return dataclasses.replace(facts, **changed)


def sft_offer(
    model: ModelSpec = LLAMA, asked: dict[str, Any] | None = None, **changed: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    factory = dataclasses.replace(model, trainer="/job.py:make_trainer")
    job = sft_job(**changed)
    levers, reasons = offer(
        factory, DeviceKind.CPU, dataset=False, fixed={}, asked=asked or {}, job=job
    )
    return dict(levers), dict(reasons)


def test_an_sft_job_gets_padding_free_where_sfttrainer_takes_it_and_else_says_why() -> None:
    levers, _ = sft_offer()
    assert levers["padding_free"] == (False, True)
    assert sft_offer(max_length=None)[0]["padding_free"] == (False, True)
    # SFTTrainer refuses padding_free without packing while max_length is set: only
    # where no sample reaches it (truncation then changes nothing)
    refused = {
        "reaches max_length 64": {"max_length": 64, "longest": 64},
        "lengths are unknown": {"longest": None},
        "flattens the batches already": {"flattens": True},
        "packs samples": {"packing": True},
        "own data_collator (MyCollator)": {"collator": "job.MyCollator"},
        "TrainingArguments has no padding_free": {
            "args_class": "transformers.TrainingArguments",
            "args_fields": ("output_dir",),
        },
    }
    for said, facts in refused.items():
        levers, reasons = sft_offer(**facts)
        assert "padding_free" not in levers and said in reasons["padding_free"], facts
    levers, reasons = sft_offer(OPT)  # its attention lets packed sequences see each other
    assert "padding_free" not in levers and "change the loss" in reasons["padding_free"]


def test_padding_free_in_an_sft_job_waits_for_a_kernel_that_skips_the_masked_row() -> None:
    """sdpa and eager attend over the whole flattened row under a mask, a (batch x
    length)^2 cost: offered with flash or flex attention, else only when asked."""
    assert sft_offer(attention="flex_attention")[0]["padding_free"] == (False, True)
    levers, reasons = sft_offer(attention="sdpa")
    assert "padding_free" not in levers
    assert "your model runs sdpa" in reasons["padding_free"]
    assert "--lever padding_free=false,true" in reasons["padding_free"]
    asked = {"padding_free": (False, True)}
    assert sft_offer(attention="sdpa", asked=asked)[0]["padding_free"] == (False, True)


def test_packing_in_an_sft_job_is_searched_only_where_asked_and_sfttrainer_packs() -> None:
    """Packed rows train several samples a step, not the recipe's: never offered
    unasked; asked, only where SFTTrainer packs (its own collator, a max_length, a
    causal LM whose loss the flattened row keeps)."""
    asked = {"packing": (False, True)}
    levers, reasons = sft_offer()
    assert "packing" not in levers and "--lever packing=false,true" in reasons["packing"]
    assert sft_offer(asked=asked)[0]["packing"] == (False, True)
    refused = {
        "packs already": {"packing": True},
        "max_length is null": {"max_length": None},
        "own data_collator (MyCollator)": {"collator": "job.MyCollator"},
        "TrainingArguments has no packing": {
            "args_class": "transformers.TrainingArguments",
            "args_fields": ("output_dir",),
        },
    }
    for said, facts in refused.items():
        try:
            levers, reasons = sft_offer(asked=asked, **facts)
        except UsageError as exc:  # asked for where it cannot run: one line says why
            assert said in str(exc), facts
        else:
            raise AssertionError(f"packing offered with {facts}")
    levers, reasons = sft_offer(OPT)
    assert "packing" not in levers
    with pytest.raises(UsageError, match="change the loss"):
        sft_offer(OPT, asked=asked)
    stand_in, why = offer(LLAMA, DeviceKind.CPU, dataset=True, fixed={}, asked={})
    assert "packing" not in dict(stand_in) and "--trainer" in dict(why)["packing"]


def test_padding_free_in_an_sft_job_is_set_in_their_sftconfig_not_their_script() -> None:
    candidate = Candidate(8, 1, "fp32", False, "adamw_torch", padding_free=True)
    fields = tuned_arguments(candidate, device_kind=DeviceKind.CPU, factory=True)
    assert (fields["padding_free"], fields["max_length"]) == (True, None)
    assert script_changes(candidate, factory=True) == []
    # the stand-in's probe flattens the batches itself; the user's script is told how
    plain = tuned_arguments(candidate, device_kind=DeviceKind.CPU)
    assert "padding_free" not in plain and "max_length" not in plain
    assert "DataCollatorWithFlattening" in script_changes(candidate)[0]
    off = tuned_arguments(
        dataclasses.replace(candidate, padding_free=False), device_kind=DeviceKind.CPU, factory=True
    )
    assert "max_length" not in off  # their own max_length stays


def test_a_lever_in_the_users_arguments_is_kept_not_searched() -> None:
    levers, reasons = offered(GPT2, fixed={"torch_compile": True})
    assert levers["torch_compile"] == (True,)
    assert "--base-args" in reasons["torch_compile"]


def test_lever_options_narrow_the_search_or_are_refused_with_the_reason() -> None:
    asked = parse_lever_options(["torch_compile=false", "attn_implementation=eager,sdpa"])
    assert asked == {"torch_compile": (False,), "attn_implementation": ("eager", "sdpa")}
    levers, _ = offered(GPT2, asked=asked)
    assert levers["torch_compile"] == (False,)
    assert levers["attn_implementation"] == ("eager", "sdpa")
    with pytest.raises(UsageError, match="flash-attn package"):
        offered(GPT2, asked={"attn_implementation": ("flash_attention_2",)})
    with pytest.raises(UsageError, match="use_liger_kernel=True: True is not available here"):
        offered(GPT2, asked={"use_liger_kernel": (True,)})
    for bad in ("fsdp=true", "torch_compile", "torch_compile=maybe", "dataloader_num_workers=x"):
        with pytest.raises(UsageError, match="--lever"):
            parse_lever_options([bad])


def test_zero_is_offered_only_to_several_processes_with_deepspeed_and_says_why_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def zero(**kw: Any) -> tuple[Any, str]:
        levers, reasons = offer(GPT2, DeviceKind.CPU, dataset=False, fixed={}, asked={}, **kw)
        return dict(levers).get("zero_stage"), dict(reasons).get("zero_stage", "")

    assert zero() == (None, "ZeRO shards across processes: it needs --nproc-per-node 2 or more")
    assert "runs your config as given" in zero(nproc_per_node=2, own_deepspeed=True)[1]
    with pytest.raises(UsageError, match=r"zero_stage=2: 2 is not available here .*2 or more"):
        offer(GPT2, DeviceKind.CPU, dataset=False, fixed={}, asked={"zero_stage": (2,)})
    pytest.importorskip("deepspeed")
    assert zero(nproc_per_node=2) == ((0, 1, 2, 3), "")
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert zero(nproc_per_node=2) == (
        None,
        "DeepSpeed on the CPU builds a C++ op (/nonexistent/g++ not found)",
    )
    monkeypatch.delenv("CXX")
    real = importlib.util.find_spec
    absent = lambda name, *a: None if name == "deepspeed" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", absent)
    assert zero(nproc_per_node=2) == (None, "DeepSpeed is not installed (pip install deepspeed)")


def test_fsdp_is_offered_to_several_processes_on_gpus_beside_no_deepspeed_of_the_users() -> None:
    """FSDP2 through the Trainer: on the CPU accelerate runs DDP under its name (a probe
    would time DDP), the Trainer refuses it beside DeepSpeed, and CPU offload is searched
    only when asked."""

    def fsdp(kind: DeviceKind = DeviceKind.CUDA, **kw: Any) -> tuple[Any, str]:
        asked = kw.pop("asked", {})
        levers, reasons = offer(GPT2, kind, dataset=False, fixed={}, asked=asked, **kw)
        return dict(levers).get("fsdp_mode"), dict(reasons).get("fsdp_mode", "")

    assert fsdp(nproc_per_node=2) == (("", "full_shard", "shard_grad_op"), "")
    assert fsdp(nproc_per_node=2, asked={"fsdp_mode": ("", "offload")}) == (("", "offload"), "")
    assert fsdp(DeviceKind.CPU, nproc_per_node=2) == (
        None,
        "FSDP through the Trainer runs on GPUs only (on the CPU accelerate runs DDP)",
    )
    assert "2 or more" in fsdp()[1]
    assert fsdp(nproc_per_node=2, own_deepspeed=True) == (
        None,
        "your --base-args set deepspeed: the Trainer refuses FSDP beside it",
    )
    assert fsdp(nproc_per_node=2, own_fsdp=True) == (
        None,
        "your --base-args set fsdp: every probe runs your config as given",
    )
    zero = offer(GPT2, DeviceKind.CUDA, dataset=False, fixed={}, asked={}, own_fsdp=True)[1]
    assert (
        dict(zero)["zero_stage"]
        == "your --base-args set fsdp: the Trainer refuses DeepSpeed beside it"
    )
    with pytest.raises(
        UsageError, match="fsdp_mode=full_shard: 'full_shard' is not available here"
    ):
        offer(
            GPT2,
            DeviceKind.CUDA,
            dataset=False,
            fixed={},
            asked={"fsdp_mode": ("full_shard",)},
            nproc_per_node=2,
            own_deepspeed=True,
        )
    assert parse_lever_options(["fsdp_mode=off,full_shard"]) == {"fsdp_mode": ("", "full_shard")}
    with pytest.raises(UsageError, match="'hybrid' is not one of off, full_shard"):
        parse_lever_options(["fsdp_mode=hybrid"])
