from __future__ import annotations

import dataclasses

import pytest
from helpers import GIB, SPEC, cand, rec

from autotune.core.errors import UsageError
from autotune.core.trial import Outcome, TrialRecord, TrialResult
from autotune.hf.models import count_parameters, resolve_model
from autotune.search.estimate import (
    Breakdown,
    activation_bytes,
    activation_scale,
    breakdown,
    check_budget,
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
    assert static_bytes(1, "fp32", "adafactor") - static_bytes(1, "fp32", "sgd") == 4
    assert static_bytes(1, "fp32", "adamw_torch") == 16


def test_activations_grow_with_batch_and_shrink_with_checkpointing() -> None:
    small = activation_bytes(GPT2, "causal-lm", cand(8), 512, 0)
    assert activation_bytes(GPT2, "causal-lm", cand(16), 512, 0) == 2 * small
    assert activation_bytes(GPT2, "causal-lm", cand(8, ckpt=True), 512, 0) < small / 2
    assert activation_bytes(GPT2, "causal-lm", cand(8, "bf16"), 512, 0) < small


def test_the_peak_is_backward_or_the_optimizer_step_whichever_is_larger() -> None:
    """An H100 probe of mT5-small (172M parameters, a 128M shared embedding) under a 4 GiB
    budget: 8x2 fp32 Adafactor peaked at 3.72 GiB, and every fp32 AdamW run out of memory
    at the 3.8 GiB limit, whatever its batch: the optimizer step's temporaries, not the
    activations, set those peaks."""
    from autotune.search.estimate import make_predictor

    counted = count_parameters(resolve_model("google/mt5-small"))
    assert counted.largest == 250112 * 512  # the shared embedding
    device = dataclasses.replace(SPEC.device, kind="cuda", name="NVIDIA H100 80GB HBM3")
    model = resolve_model("google/mt5-small")
    spec = dataclasses.replace(SPEC, model=model, device=device, seq_len=64, target_len=16,
                               memory_budget_bytes=4 * GIB, parameters=counted.total,
                               embedding_parameters=counted.embedding,
                               largest_parameter=counted.largest)  # fmt: skip
    one = cand(1)  # 1x16 in that search; accumulation changes no term
    adamw = breakdown(counted.total, model.config, model.task, one, 64, 16, largest=counted.largest,
                      device_kind="cuda")  # fmt: skip
    assert adamw.step == 4 * counted.total > adamw.activations  # foreach: a copy of all
    assert adamw.total == adamw.static + adamw.step
    on_cpu = breakdown(counted.total, model.config, model.task, one, 64, 16,
                       largest=counted.largest, device_kind="cpu")  # fmt: skip
    assert on_cpu.step == 2 * 4 * counted.largest  # a tensor at a time
    fused = dataclasses.replace(one, optim="adamw_torch_fused")
    assert breakdown(counted.total, model.config, model.task, fused, 64, 16,
                     largest=counted.largest, device_kind="cuda").step == 0  # fmt: skip
    predict = make_predictor(spec, [])  # before any probe: no activation term
    adafactor = dataclasses.replace(cand(8), optim="adafactor")
    assert 0.9 * 3.72 * GIB < predict(adafactor) <= spec.fit_limit_bytes  # it took 3.72
    # after that probe (its CUDA context measured at 676 MiB): 1x16 AdamW cannot fit
    fitted = rec(0, adafactor, peak_gib=3.72)
    fitted = dataclasses.replace(
        fitted, result=fitted.result.replace(baseline={"context_bytes": 708_837_376})
    )
    predict = make_predictor(spec, [fitted])
    assert predict(one) > spec.fit_limit_bytes  # it ran out of memory
    assert predict(adafactor) <= spec.fit_limit_bytes


def test_activation_scale_is_the_most_optimistic_fit() -> None:
    b = Breakdown(weights=GIB, gradients=GIB, optimizer_state=0, activations=GIB)
    runs = [
        (b, TrialResult(Outcome.OK, peak_memory_bytes=4 * GIB)),  # 2 GiB of activations
        (b, TrialResult(Outcome.OK, peak_memory_bytes=3 * GIB)),  # 1 GiB
        (b, TrialResult(Outcome.OOM, peak_memory_bytes=9 * GIB)),  # not a clean run
    ]
    assert activation_scale(runs, process_bytes=0) == 1.0
    assert activation_scale([], process_bytes=0) is None
    # a peak the optimizer step may have set (1 GiB of its temporaries, 1 GiB above the
    # static terms) says nothing of the activations: left out, not read as a scale of 1
    stepped = Breakdown(weights=GIB, gradients=GIB, optimizer_state=0, activations=GIB // 8,
                        step=GIB)  # fmt: skip
    assert activation_scale([(stepped, TrialResult(Outcome.OK, peak_memory_bytes=3 * GIB))],
                            process_bytes=0) is None  # fmt: skip


def test_the_process_term_is_what_the_probes_measured_before_training() -> None:
    """On an H100 the context was 676 MiB where the typical figure says 600."""
    from helpers import rec

    from autotune.search.estimate import PROCESS_BYTES, process_bytes

    def with_baseline(number: int, baseline: dict[str, int]) -> TrialRecord:
        record = rec(number, cand(8))
        return dataclasses.replace(record, result=record.result.replace(baseline=baseline))

    mib = 2**20
    cuda = [with_baseline(0, {"context_bytes": 676 * mib}), with_baseline(1, {}),
            with_baseline(2, {"context_bytes": 680 * mib}),
            with_baseline(3, {"context_bytes": 670 * mib})]  # fmt: skip
    assert process_bytes("cuda", cuda) == 676 * mib
    assert process_bytes("cuda", []) == PROCESS_BYTES["cuda"]
    cpu = [with_baseline(0, {"rss_bytes": 420 * mib, "vmdata_bytes": 1300 * mib})]
    assert process_bytes("cpu", cpu) == 420 * mib  # the peak counts the resident set


def test_budget_below_the_weights_is_refused_with_the_estimate() -> None:
    with pytest.raises(UsageError, match=r"below the 3\.7 GiB the fp32 weights alone need"):
        check_budget(10**9, ("fp32",), ("adamw_torch",), 2 * GIB)


def test_budget_that_only_an_8bit_optimizer_meets_says_so() -> None:
    params = 100_000_000  # fp32 adamw 1.6 GB, 8-bit 1.0 GB, adafactor 1.2 GB
    with pytest.raises(UsageError, match=r"--optimizers .*adamw_bnb_8bit"):
        check_budget(params, ("fp32",), ("adamw_torch",), int(1.1e9))
    check_budget(params, ("fp32",), ("adamw_torch", "adamw_bnb_8bit"), int(1.1e9))


def test_zero_splits_the_static_bytes_per_process_and_the_budget_check_knows_it() -> None:
    zero3 = dataclasses.replace(cand(8), zero_stage=3)
    ddp = breakdown(10**8, GPT2, "causal-lm", cand(8), 512, 0, nproc_per_node=2)
    split = breakdown(10**8, GPT2, "causal-lm", zero3, 512, 0, nproc_per_node=2)
    assert split.static * 2 == ddp.static and split.activations == ddp.activations
    zero1 = breakdown(10**8, GPT2, "causal-lm", dataclasses.replace(cand(8), zero_stage=1),
                      512, 0, nproc_per_node=2)  # fmt: skip
    assert (zero1.weights, zero1.gradients) == (ddp.weights, ddp.gradients)
    assert zero1.optimizer_state * 2 == ddp.optimizer_state
    params = 100_000_000  # fp32 AdamW: 1.6 GB in one process, 0.8 GB in each of two
    with pytest.raises(UsageError):
        check_budget(params, ("fp32",), ("adamw_torch",), GIB)
    check_budget(params, ("fp32",), ("adamw_torch",), GIB, split=(2, 2, 2))


def test_8bit_optimizers_keep_32bit_state_for_embeddings_as_the_trainer_does() -> None:
    """transformers' create_optimizer registers optim_bits=32 for every nn.Embedding
    under bitsandbytes' 8-bit optimizers: on mT5-small's shape (128M of 172M parameters
    in the embedding) 8-bit Adam then holds 1.0 GiB of state, not 0.3."""
    from autotune.search.estimate import optimizer_state

    total, embedding = 172_000_000, 128_000_000
    assert optimizer_state(total, "adamw_bnb_8bit", embedding) == 44_000_000 * 2 + embedding * 8
    assert optimizer_state(total, "lion_8bit", embedding) == 44_000_000 + embedding * 4
    assert optimizer_state(total, "adamw_torch", embedding) == total * 8  # no override
    assert optimizer_state(total, "adamw_torch_8bit", embedding) == total * 2  # torchao
    assert static_bytes(total, "fp32", "adamw_bnb_8bit", embedding=embedding) == (
        total * 8 + 44_000_000 * 2 + embedding * 8
    )
