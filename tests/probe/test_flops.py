"""The FLOP model against torch's own count, and the peak measurement under transformers' tf32.

The reference is `torch.utils.flop_counter.FlopCounterMode` over one sample's forward and
backward in training mode. The models use eager attention: on the CPU, SDPA runs
`_scaled_dot_product_flash_attention_for_cpu`, which FlopCounterMode has no formula for,
so it would count attention as free. Sizes and lengths keep attention a visible share.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import TINY_GPT2
from torch.utils.flop_counter import FlopCounterMode

from autotune.hf.models import PRESET_DIR
from autotune.probe.flops import flops_per_sample, measure_peak_flops

TINY = {"vocab_size": 512, "max_position_embeddings": 256}
# name: (task, config, source length, target length)
CASES: dict[str, tuple[str, dict[str, Any], int, int]] = {
    "gpt2": ("causal-lm", TINY_GPT2, 128, 0),
    # untied output embeddings, rotary positions
    "gpt-neox": (
        "causal-lm",
        {
            "model_type": "gpt_neox",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 256,
            **TINY,
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
        128,
        0,
    ),
    # heads x d_kv != d_model; more decoder layers than encoder layers; untied head
    "t5": (
        "seq2seq",
        {
            "model_type": "t5",
            "d_model": 64,
            "d_ff": 128,
            "d_kv": 8,
            "num_heads": 4,
            "num_layers": 2,
            "num_decoder_layers": 3,
            "feed_forward_proj": "gated-gelu",
            "tie_word_embeddings": False,
            "vocab_size": 512,
            "decoder_start_token_id": 0,
            "pad_token_id": 0,
            "eos_token_id": 1,
        },
        128,
        32,
    ),
    # the BART family's names: encoder_attn.k_proj, decoder_layers, decoder_attention_heads
    "bart": (
        "seq2seq",
        {
            "model_type": "bart",
            "d_model": 64,
            "encoder_layers": 2,
            "decoder_layers": 1,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128,
            **TINY,
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
            "decoder_start_token_id": 2,
        },
        128,
        32,
    ),
    "bert-mlm": (
        "masked-lm",
        {
            "model_type": "bert",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            **TINY,
        },
        128,
        0,
    ),
    # pooler and classifier on the [CLS] token only
    "bert-classifier": (
        "classification",
        {
            "model_type": "bert",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            **TINY,
            "num_labels": 2,
        },
        128,
        0,
    ),
}


def build(task: str, config: dict[str, Any]) -> Any:
    """A random model with eager attention, so FlopCounterMode sees the attention matmuls."""
    import transformers

    values = dict(config)
    auto = {
        "seq2seq": transformers.AutoModelForSeq2SeqLM,
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "classification": transformers.AutoModelForSequenceClassification,
    }[task]
    model_config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    return auto.from_config(  # type: ignore[no-untyped-call]
        model_config, attn_implementation="eager"
    )


def counted(model: Any, task: str, source_len: int, target_len: int) -> tuple[int, int]:
    """FlopCounterMode's FLOPs of one sample's forward + backward, and its attention part."""
    device, vocab = model.device, model.config.vocab_size
    ids = torch.randint(3, vocab, (1, source_len), device=device)
    labels = {
        "seq2seq": torch.randint(3, vocab, (1, target_len), device=device),
        "classification": torch.tensor([1], device=device),
    }.get(task, ids)
    model.train()
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=labels).loss.backward()
    by_op = counter.get_flop_counts()["Global"]
    return counter.get_total_flops(), by_op.get(torch.ops.aten.bmm, 0)


@pytest.mark.parametrize("name", list(CASES))
def test_flops_per_sample_matches_flop_counter(name: str) -> None:
    task, config, source_len, target_len = CASES[name]
    model = build(task, config)
    total, attention = counted(model, task, source_len, target_len)
    assert attention > 0.1 * total  # attention is a visible share: the test can see it
    ours = flops_per_sample(model, task, source_len, target_len)
    assert ours == pytest.approx(total, rel=0.15)


def test_a_lora_models_attention_backward_is_counted_whole() -> None:
    """Under a LoRA adapter the base's weights take no gradient of their own, but
    attention's matmuls, which have no weights, still take the gradients of both their
    inputs: 3 forwards' worth, as in full fine-tuning (a Llama shape with grouped
    key/value heads, its every linear layer adapted, attention half its FLOPs at these
    lengths: counted as frozen weights are, the total read 13% low)."""
    from peft import LoraConfig, get_peft_model

    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, **TINY}
    config |= {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    base = build("causal-lm", config)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = LoraConfig(r=4, target_modules=targets, task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    total, attention = counted(model, "causal-lm", 256, 0)
    assert attention > 0.4 * total
    assert flops_per_sample(model, "causal-lm", 256, 0) == pytest.approx(total, rel=0.05)


def test_meta_device_counts_as_real_weights_do() -> None:
    """Shapes alone decide the count, which lets the mT5 test skip 300M random weights."""
    task, config, source_len, target_len = CASES["t5"]
    with torch.device("meta"):
        meta = build(task, config)
    real = build(task, config)
    assert counted(meta, task, source_len, target_len) == counted(
        real, task, source_len, target_len
    )


def test_mt5_small_preset_matches_flop_counter() -> None:
    """The case that was 3.6x: mT5-small at 64 source and 16 target tokens (~23 GFLOP)."""
    config = json.loads((PRESET_DIR / "google__mt5-small.json").read_text())
    with torch.device("meta"):
        model = build("seq2seq", config)
    total, _ = counted(model, "seq2seq", 64, 16)
    assert flops_per_sample(model, "seq2seq", 64, 16) == pytest.approx(total, rel=0.15)


@pytest.fixture
def transformers_tf32() -> Iterator[None]:
    """TF32 on the way transformers 5 turns it on (`enable_tf32`: the new API, all backends)."""
    backends: Any = torch.backends
    generic, matmul = backends.fp32_precision, backends.cuda.matmul.fp32_precision
    backends.fp32_precision = "tf32"
    try:
        yield
    finally:
        backends.fp32_precision = generic
        backends.cuda.matmul.fp32_precision = matmul


def test_torch_refuses_the_legacy_tf32_flag_after_the_new_api(transformers_tf32: None) -> None:
    """Why measure_peak_flops must not read `allow_tf32` (torch 2.9 and later)."""
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        bool(torch.backends.cuda.matmul.allow_tf32)


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_peak_flops_under_transformers_tf32(transformers_tf32: None, precision: str) -> None:
    assert measure_peak_flops("cpu", precision, seconds=0.05) > 0
    assert torch.backends.fp32_precision == "tf32"  # type: ignore[attr-defined]
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"


@pytest.mark.parametrize("precision", ["fp32", "bf16", "tf32"])
def test_peak_flops_is_measured(precision: str) -> None:
    before = torch.backends.cuda.matmul.fp32_precision
    assert measure_peak_flops("cpu", precision, seconds=0.05) > 1e8
    assert torch.backends.cuda.matmul.fp32_precision == before


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16", "as-loaded"])
def test_a_probes_mfu_is_taken_against_the_peak_of_the_precision_it_trained_in(
    monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """Each precision's peak differs (bf16's matmuls are several times fp32's on a GPU):
    a probe's MFU against another precision's peak would be off by that factor. as-loaded
    (no autocast, the job's own dtype) has no known peak: none rather than a wrong one."""
    from autotune.core.enums import DeviceKind, Precision
    from autotune.probe import main
    from autotune.probe.main import peak_flops

    peaks = {"fp32": 1e9, "tf32": 2e9, "bf16": 4e9, "fp16": 5e9}
    monkeypatch.setattr(main, "measure_peak_flops", lambda device, p, **kw: peaks[p])
    assert peak_flops(Precision(precision), DeviceKind.CPU) == peaks.get(precision)


@pytest.mark.cuda
def test_the_gpu_peak_is_the_plain_products_not_their_casts_and_syncs() -> None:
    """MFU's peak on a GPU: a bf16 product of bf16 tensors timed by CUDA events over a
    run of them. autocast's casts of fp32 inputs and a sync after each product read about
    a quarter low, so every MFU the search showed read high."""
    size, runs = 8192, 20
    a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        a @ b
    end.record()
    torch.cuda.synchronize()
    plain = 2 * size**3 * runs / (start.elapsed_time(end) / 1000)
    measured = measure_peak_flops("cuda", "bf16")
    assert 0.85 * plain <= measured <= 1.15 * plain, (measured / 1e12, plain / 1e12)
