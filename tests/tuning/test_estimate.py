from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from helpers import GIB, SPEC, cand, loaded_llama, rec

from autotune.core.checkpointing import Checkpointing
from autotune.core.errors import UsageError
from autotune.core.job import ParameterCount
from autotune.core.trial import Candidate
from autotune.hf.models import count_parameters, resolve_model
from autotune.tuning.estimate import (
    activation_bytes,
    breakdown,
    check_budget,
    floor_bytes,
    static_bytes,
)

GPT2 = {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257}


def test_parameter_count_of_presets_without_allocating() -> None:
    # gpt2 as published: 124,439,808 parameters (tied embeddings).
    counted = count_parameters(resolve_model("gpt2"))
    # wte (50257 x 768, tied with the head) and wpe (1024 x 768) are the embeddings
    assert (counted.total, counted.embedding) == (124_439_808, 50257 * 768 + 1024 * 768)


def test_bytes_per_parameter_follow_the_published_rule() -> None:
    assert static_bytes(1, "bf16", "adamw_torch") == 18  # mixed-precision AdamW
    assert static_bytes(1, "fp16", "adamw_torch") - static_bytes(1, "fp16", "adamw_bnb_8bit") == 6
    # Adafactor's state is factored (rows and columns of each matrix): 1, not the rule's 4
    assert static_bytes(1, "fp32", "adafactor") - static_bytes(1, "fp32", "sgd") == 1
    assert static_bytes(1, "fp32", "adamw_torch") == 16


def test_activations_grow_with_batch_and_shrink_with_checkpointing() -> None:
    small = activation_bytes(GPT2, "causal-lm", cand(8), 512, 0)
    assert activation_bytes(GPT2, "causal-lm", cand(16), 512, 0) == 2 * small
    assert activation_bytes(GPT2, "causal-lm", cand(8, ckpt=True), 512, 0) < small / 2
    assert activation_bytes(GPT2, "causal-lm", cand(8, "bf16"), 512, 0, "cuda") < small


def test_autocast_saves_half_the_activations_on_a_gpu_and_less_on_the_cpu() -> None:
    """On the CPU a small GPT-2 peaked at 734-772 MiB at batch 8 in bf16 and 762-766 in
    fp32: an estimate at half fp32's activations put bf16 under a budget it then
    overran, a wasted probe in each memory-bound search. BERT's bf16 saved 7-15%."""
    fp32 = activation_bytes(GPT2, "causal-lm", cand(8), 512, 0, "cuda")
    assert activation_bytes(GPT2, "causal-lm", cand(8), 512, 0, "cpu") == fp32
    layers = fp32 - 12 * 8 * 512 * GPT2["vocab_size"]  # the logits stay in fp32
    on_gpu = activation_bytes(GPT2, "causal-lm", cand(8, "bf16"), 512, 0, "cuda")
    assert fp32 - on_gpu == layers // 2
    on_cpu = activation_bytes(GPT2, "causal-lm", cand(8, "bf16"), 512, 0, "cpu")
    assert fp32 - on_cpu == pytest.approx(0.15 * layers, rel=1e-6)
    # fp16 trains in fp32 on the CPU (accelerate enables its autocast on GPUs only)
    assert activation_bytes(GPT2, "causal-lm", cand(8, "fp16"), 512, 0, "cpu") == fp32


def test_a_job_held_in_16_bits_has_16_bit_activations_on_the_cpu_too() -> None:
    """Autocast over a model built in fp32 keeps an fp32 residual stream on the CPU; a
    job held in bf16 (a checkpoint stored so; a 4-bit base) keeps the 16-bit figure, which
    its probes' peaks matched (estimate / peak 0.99 for LoRA on a bf16 checkpoint)."""
    from autotune.tuning._memory_verdict import spec_breakdown

    spec = dataclasses.replace(
        SPEC, parameters=10**6, model=dataclasses.replace(SPEC.model, config=GPT2)
    )
    held = dataclasses.replace(spec, job_profile={"held": {"frozen bfloat16": 10**6}})
    stand_in = spec_breakdown(spec, cand(8, "bf16")).activations
    theirs = spec_breakdown(held, cand(8, "bf16")).activations
    on_gpu = activation_bytes(GPT2, "causal-lm", cand(8, "bf16"), 128, 0, "cuda")
    assert theirs == on_gpu < stand_in


def test_the_peak_is_backward_or_the_optimizer_step_whichever_is_larger() -> None:
    """An H100 probe of mT5-small (172M parameters, a 128M shared embedding) under a 4 GiB
    budget: 8x2 fp32 Adafactor peaked at 3.72 GiB, and every fp32 AdamW run out of memory
    at the 3.8 GiB limit, whatever its batch: the optimizer step's temporaries, not the
    activations, set those peaks."""
    from autotune.tuning._memory_verdict import far_over_budget

    counted = count_parameters(resolve_model("google/mt5-small"))
    assert counted.largest == 250112 * 512  # the shared embedding
    device = dataclasses.replace(SPEC.device, kind="cuda", name="NVIDIA H100 80GB HBM3")
    model = resolve_model("google/mt5-small")
    spec = dataclasses.replace(
        SPEC,
        model=model,
        device=device,
        seq_len=64,
        target_len=16,
        memory_budget_bytes=4 * GIB,
        parameters=counted.total,
        embedding_parameters=counted.embedding,
        largest_parameter=counted.largest,
    )
    one = cand(1)  # 1x16 in that search, here 1x64: both accumulate
    adamw = breakdown(
        counted.total,
        model.config,
        model.task,
        one,
        64,
        16,
        largest=counted.largest,
        device_kind="cuda",
    )
    assert adamw.step == 4 * counted.total > adamw.activations  # foreach: a copy of all
    # backward's end: the shared embedding's two gradients, their sum, all three alive
    # above the accumulated gradient (an H100: 1.43 GiB at 8x2 to 1x16, checkpointed)
    assert adamw.embedding_grads == 3 * 4 * counted.largest > adamw.step
    assert adamw.total == adamw.static + adamw.embedding_grads
    whole = breakdown(
        counted.total,
        model.config,
        model.task,
        cand(64),
        64,
        16,
        largest=counted.largest,
        device_kind="cuda",
    )
    assert whole.embedding_grads == 2 * 4 * counted.largest  # the sum is the gradient (0.91)
    on_cpu = breakdown(
        counted.total,
        model.config,
        model.task,
        one,
        64,
        16,
        largest=counted.largest,
        device_kind="cpu",
    )
    assert on_cpu.step == 2 * 4 * counted.largest  # a tensor at a time
    fused = dataclasses.replace(one, optim="adamw_torch_fused")
    assert (
        breakdown(
            counted.total,
            model.config,
            model.task,
            fused,
            64,
            16,
            largest=counted.largest,
            device_kind="cuda",
        ).step
        == 0
    )
    predict = far_over_budget(spec, []).predict  # before any probe: no activation term
    adafactor = dataclasses.replace(cand(8), optim="adafactor")
    assert 0.9 * 3.72 * GIB < predict(adafactor) <= spec.fit_limit_bytes  # it took 3.72
    # after that probe (its CUDA context measured at 676 MiB): 1x16 AdamW cannot fit
    fitted = rec(0, adafactor, peak_gib=3.72)
    fitted = dataclasses.replace(
        fitted, result=fitted.result.replace(baseline={"context_bytes": 708_837_376})
    )
    predict = far_over_budget(spec, [fitted]).predict
    assert predict(one) > spec.fit_limit_bytes  # it ran out of memory
    assert predict(adafactor) <= spec.fit_limit_bytes


def test_backward_ends_with_the_gradients_of_an_embedding_used_twice() -> None:
    """Shared by encoder and decoder (also under a classification head) or tied to the
    output layer: three copies, less the one that becomes the gradient when nothing
    accumulates; used once: one copy, only when it accumulates; none under ZeRO, which
    accumulates in its own buffers."""
    from autotune.tuning.estimate import embedding_grad_bytes

    untied = {"tie_word_embeddings": False}
    assert embedding_grad_bytes(GPT2, "causal-lm", 10, 1) == 2 * 40  # tied by default
    assert embedding_grad_bytes(GPT2, "causal-lm", 10, 4) == 3 * 40
    assert embedding_grad_bytes(untied, "causal-lm", 10, 1) == 0
    assert embedding_grad_bytes(untied, "causal-lm", 10, 4) == 40
    bart = {"is_encoder_decoder": True}
    assert embedding_grad_bytes(bart, "classification", 10, 2) == 3 * 40
    assert embedding_grad_bytes({}, "classification", 10, 2) == 40
    zero = dataclasses.replace(cand(8), zero_stage=2)
    assert (
        breakdown(
            10**8, GPT2, "causal-lm", zero, 512, 0, nproc_per_node=2, largest=10**7
        ).embedding_grads
        == 0
    )
    assert breakdown(10**8, GPT2, "causal-lm", cand(8), 512, 0, largest=10**7).embedding_grads


def test_budget_below_the_weights_is_refused_with_the_estimate() -> None:
    with pytest.raises(UsageError, match=r"below the 3\.7 GiB the fp32 weights alone need"):
        check_budget(10**9, ("fp32",), ("adamw_torch",), 2 * GIB)


def test_budget_that_only_an_8bit_optimizer_meets_says_so() -> None:
    params = 100_000_000  # fp32 adamw 1.6 GB, 8-bit 1.0 GB, adafactor 0.9 GB
    with pytest.raises(UsageError, match=r"--optimizers .*adamw_bnb_8bit"):
        check_budget(params, ("fp32",), ("adamw_torch",), int(1.1e9))
    check_budget(params, ("fp32",), ("adamw_torch", "adamw_bnb_8bit"), int(1.1e9))


def test_zero_splits_the_static_bytes_per_process_and_the_budget_check_knows_it() -> None:
    zero3 = dataclasses.replace(cand(8), zero_stage=3)
    ddp = breakdown(10**8, GPT2, "causal-lm", cand(8), 512, 0, nproc_per_node=2)
    split = breakdown(10**8, GPT2, "causal-lm", zero3, 512, 0, nproc_per_node=2)
    assert split.static * 2 == ddp.static and split.activations == ddp.activations
    zero1 = breakdown(
        10**8,
        GPT2,
        "causal-lm",
        dataclasses.replace(cand(8), zero_stage=1),
        512,
        0,
        nproc_per_node=2,
    )
    assert (zero1.weights, zero1.gradients) == (ddp.weights, ddp.gradients)
    assert zero1.optimizer_state * 2 == ddp.optimizer_state
    params = 100_000_000  # fp32 AdamW: 1.6 GB in one process, 0.8 GB in each of two
    with pytest.raises(UsageError):
        check_budget(params, ("fp32",), ("adamw_torch",), GIB)
    check_budget(params, ("fp32",), ("adamw_torch",), GIB, split=(2, 2, 2))


def test_fsdp_shares_the_state_per_process_as_its_mode_holds_it() -> None:
    """Full shard: each process holds its share of the weights, gradients and optimizer
    state (32-bit shards whatever the precision, unlike ZeRO's 16-bit engine);
    shard-grad-op holds the gathered weights from the forward to the backward; offload
    keeps the gradients and the state in host memory."""

    def of(precision: str = "fp32", **levers: object) -> Any:
        candidate = dataclasses.replace(cand(8, precision), **levers)
        return breakdown(10**8, GPT2, "causal-lm", candidate, 512, 0, nproc_per_node=2)

    ddp, full = of(), of(fsdp_mode="full_shard")
    assert (full.weights * 2, full.gradients * 2) == (ddp.weights, ddp.gradients)
    assert full.optimizer_state * 2 == ddp.optimizer_state
    assert full.activations == ddp.activations
    grad_op = of(fsdp_mode="shard_grad_op")
    assert (grad_op.weights, grad_op.gradients * 2) == (ddp.weights, ddp.gradients)
    offload = of(fsdp_mode="offload")
    assert (offload.gradients, offload.optimizer_state) == (0, 0)
    assert offload.weights == full.weights
    fsdp16 = dataclasses.replace(cand(8, "bf16"), fsdp_mode="full_shard")
    zero16 = dataclasses.replace(cand(8, "bf16"), zero_stage=3)
    # weights and gradients 2 bytes a parameter wider than ZeRO's, split in two
    assert floor_bytes(10**8, fsdp16, 2) - floor_bytes(10**8, zero16, 2) == 2 * 10**8
    assert floor_bytes(10**8, dataclasses.replace(fsdp16, fsdp_mode="offload"), 2) == 0


def test_8bit_optimizers_keep_32bit_state_for_embeddings_as_the_trainer_does() -> None:
    """transformers' create_optimizer registers optim_bits=32 for every nn.Embedding
    under bitsandbytes' 8-bit optimizers: on mT5-small's shape (128M of 172M parameters
    in the embedding) 8-bit Adam then holds 1.0 GiB of state, not 0.3."""
    from autotune.tuning.estimate import optimizer_state

    total, embedding = 172_000_000, 128_000_000
    assert optimizer_state(total, "adamw_bnb_8bit", embedding) == 44_000_000 * 2 + embedding * 8
    assert optimizer_state(total, "lion_8bit", embedding) == 44_000_000 + embedding * 4
    assert optimizer_state(total, "adamw_torch", embedding) == total * 8  # no override
    assert optimizer_state(total, "adamw_torch_8bit", embedding) == total * 2  # torchao
    assert static_bytes(total, "fp32", "adamw_bnb_8bit", embedding=embedding) == (
        total * 8 + 44_000_000 * 2 + embedding * 8
    )


def _lora_on_8b_bf16() -> tuple[dict[str, Any], ParameterCount]:
    """A Llama-3-8B-shaped model held in bf16 with LoRA r=16 on every linear layer,
    built on the meta device (nothing allocated, nothing trained), as a factory would
    load a bf16 checkpoint and wrap it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from autotune.hf.models import parameter_count

    config = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
    return config.to_dict(), parameter_count(model)


def test_a_lora_job_on_an_8b_bf16_base_fits_24_gib_with_its_base_at_2_bytes() -> None:
    config, counted = _lora_on_8b_bf16()
    frozen = counted.total - counted.trainable
    assert counted.total > 8 * 10**9 and counted.trainable < counted.total / 100
    assert counted.frozen_bytes == 2 * frozen  # bf16, as held
    # not refused: 15 GiB of frozen bf16 weights, the adapter's state tiny
    check_budget(counted.total, ("fp32", "bf16"), ("adamw_torch",), 24 * GIB, **_held(counted))
    b = breakdown(
        counted.total,
        config,
        "causal-lm",
        cand(8, "bf16"),
        512,
        0,
        device_kind="cuda",
        **_held(counted),
    )
    assert b.weights == 2 * frozen + 6 * counted.trainable
    # gradients and AdamW's state for the adapter alone: a frozen base has none
    assert b.gradients == 4 * counted.trainable
    assert b.optimizer_state == 8 * counted.trainable
    with pytest.raises(UsageError, match="weights as your job holds them"):
        check_budget(counted.total, ("bf16",), ("adamw_torch",), 14 * GIB, **_held(counted))


def test_gradients_and_state_are_never_charged_to_frozen_parameters() -> None:
    total, trainable = 10**9, 10**7
    full = static_bytes(total, "fp32", "adamw_torch")
    frozen_bytes = 2 * (total - trainable)  # a bf16 base
    lora = static_bytes(
        total, "fp32", "adamw_torch", trainable=trainable, frozen_bytes=frozen_bytes
    )
    assert full == 16 * total
    assert lora == 2 * (total - trainable) + 16 * trainable


def test_a_4bit_base_is_held_at_about_half_a_byte_a_parameter() -> None:
    """A real 4-bit NF4 base on the CPU (bitsandbytes), prepared for k-bit training and
    wrapped in LoRA, as a QLoRA script builds it."""
    import torch

    from autotune.hf.models import held_bytes, parameter_count

    model = loaded_llama(quantized=True)
    packed = [p for p in model.parameters() if getattr(p, "quant_state", None) is not None]
    elements = sum(int(torch.Size(p.quant_state.shape).numel()) for p in packed)
    assert 0.5 <= sum(map(held_bytes, packed)) / elements <= 0.6  # packed weights, absmax
    counted = parameter_count(model)
    assert counted.frozen_bytes < 0.7 * (counted.total - counted.trainable) * 2  # < bf16's


def _held(counted: ParameterCount) -> dict[str, int]:
    """What the estimate takes of a count besides the total."""
    keys = ("embedding", "trainable", "frozen_bytes")
    return {k: getattr(counted, k) for k in keys}


def test_activations_fall_along_the_checkpointing_levels() -> None:
    """GPT-2's 12 layers: every level keeps fewer activations than the one before; offload
    moves the checkpointed inputs off the GPU (on the CPU they stay where they are)."""
    held = [
        activation_bytes(GPT2, "causal-lm", cand(8, ckpt=level), 512, 0, "cuda")
        for level in Checkpointing
    ]
    assert held == sorted(held, reverse=True) and len(set(held)) == len(held)
    on_cpu = activation_bytes(GPT2, "causal-lm", cand(8, ckpt=Checkpointing.OFFLOAD), 512, 0)
    assert on_cpu == activation_bytes(GPT2, "causal-lm", cand(8, ckpt=Checkpointing.ON), 512, 0)


def test_a_fused_lm_head_holds_one_tile_of_the_logits_not_all_of_them() -> None:
    """TRL's SFTTrainer folds the logits tile by tile (4096 tokens x 32768 entries at
    most): the CPU's torch fold holds fp32 temporaries per entry, Triton on CUDA only the
    tile's buffer in the compute dtype; the Trainer's head holds every token's logits
    and their gradient in fp32."""
    from autotune.tuning.estimate import logit_bytes

    bf16 = Candidate(8, 1, "bf16", False, "adamw_torch")
    fp32 = Candidate(8, 1, "fp32", False, "adamw_torch")
    assert logit_bytes(512, 32000, bf16, "cpu", False) == 12 * 512 * 32000
    assert logit_bytes(512, 32000, bf16, "cpu", True) == 512 * 32000 * (2 + 38)
    assert logit_bytes(512, 32000, bf16, "cuda", True) == 512 * 32000 * 2
    assert logit_bytes(512, 32000, fp32, "cuda", True) == 512 * 32000 * 4
    # a tile is at most 4096 tokens by 32768 entries, however long the batch or vocabulary
    tile = 4096 * 32768 * 2
    assert logit_bytes(16 * 2048, 128256, bf16, "cuda", True) == tile


def test_the_certain_floor_holds_a_frozen_base_as_it_is_held() -> None:
    """What the skip rule refuses on with no margin: the frozen base at the bytes it is
    held in (2 a parameter in bf16, about half a byte in 4 bits), the adapter's weights
    and gradients in 32 bits and AdamW's 8 bytes of state for the adapter alone."""
    from autotune.tuning.estimate import floor_bytes

    total, trainable = 10**9, 10**7
    frozen = total - trainable
    adapter = 4 * trainable + 4 * trainable + 8 * trainable
    bf16 = cand(8, "bf16")
    assert floor_bytes(total, bf16, trainable=trainable, frozen_bytes=2 * frozen) == (
        2 * frozen + adapter
    )
    nf4 = frozen * 9 // 16  # packed 4-bit weights and their absmax: about half a byte
    assert floor_bytes(total, bf16, trainable=trainable, frozen_bytes=nf4) == nf4 + adapter
    # a frozen embedding has no state: 8-bit Adam's 32-bit embedding state is not held
    eight_bit = dataclasses.replace(bf16, optim="adamw_bnb_8bit")
    assert (
        floor_bytes(total, eight_bit, embedding=10**8, trainable=trainable, frozen_bytes=nf4)
        == nf4 + 8 * trainable + 2 * trainable
    )


def test_a_checkpointed_stack_holds_one_recomputed_layer_at_a_time() -> None:
    """Checkpointed, a layer keeps only its input (2*s*b*h bytes at 16 bits) until
    backward recomputes it: one layer's activations, s*b*h*(34 + 5*a*s/h), are alive at
    a time. An encoder-decoder recomputes its decoder's layers before its encoder's:
    the larger of the two stacks' layers, never both together."""
    config = {"d_model": 64, "num_layers": 4, "num_heads": 4, "vocab_size": 100}
    b, h, a = 8, 64, 4

    def layer(s: int, attended: int) -> int:  # fp32: twice the 16-bit figure
        return s * b * h * (34 + 5 * a * attended // h) * 2

    def inputs(s: int) -> int:
        return 2 * s * b * h * 2

    def held(level: Checkpointing, task: str = "classification", target: int = 0) -> int:
        return activation_bytes(config, task, cand(b, ckpt=level), 128, target, "cuda")

    assert held(Checkpointing.OFF) == 4 * layer(128, 128)
    assert held(Checkpointing.ON) == 4 * inputs(128) + layer(128, 128)
    # layers 0 and 2 checkpointed, 1 and 3 keep everything
    assert held(Checkpointing.EVERY_2) == 2 * layer(128, 128) + 2 * inputs(128) + layer(128, 128)
    assert held(Checkpointing.OFFLOAD) == layer(128, 128)  # the inputs in host memory
    encoder, decoder = layer(128, 128), layer(64, 64 + 128)
    logits = 12 * b * 64 * config["vocab_size"]
    assert held(Checkpointing.ON, "seq2seq", 64) == (
        4 * inputs(128) + 4 * inputs(64) + max(encoder, decoder) + logits
    )
