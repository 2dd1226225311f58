"""Records built by hand, for the pure parts (selection, skip rules, export)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.core.device import DeviceInfo
from autotune.core.space import SearchSpace
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, ModelSpec, Outcome, TrialRecord, TrialResult

GIB = 2**30

SPACE = SearchSpace(
    global_batch_size=64,
    micro_batches=(8, 16, 32, 64),
    fallback_batches=(1, 2, 4),
    precisions=("fp32", "bf16"),
    checkpointing=(False, True),
    optimizers=("adamw_torch",),
)

SPEC = SearchSpec(
    model=ModelSpec("tiny", "local", "causal-lm", {"model_type": "gpt2"}),
    device=DeviceInfo("cpu", None, "test cpu", 16 * 2**30),
    space=SPACE,
    seq_len=128,
    target_len=32,
    memory_budget_bytes=8 * 2**30,
)


# Two values of every dimension a candidate has beyond its batch split, the plain one
# first. Written out here, not read from the code: a setting added to the candidate must
# be named here, with what an out-of-memory says across it.
DIMENSIONS = {
    "precision": ("fp32", "bf16"),
    "activation_checkpointing": (False, True),
    "optim": ("adamw_torch", "adafactor"),
    "train_sampling_strategy": ("random", "group_by_length"),
    "torch_compile": (False, True),
    "attn_implementation": ("sdpa", "eager"),
    "use_liger_kernel": (False, True),
    "padding_free": (False, True),
    "packing": (False, True),
    "dataloader_num_workers": (0, 2),
    "zero_stage": (0, 2),
    "fsdp_mode": ("", "full_shard"),
}
# A probe measures memory on worst-case batches: the order of the real batches and the
# processes that load them leave its peak alone, so an out-of-memory holds across them.
MEMORY_FREE = {"train_sampling_strategy", "dataloader_num_workers"}


def cand(batch: int, precision: str = "fp32", ckpt: bool | str = False) -> Candidate:
    return SPACE.candidate(batch, precision, ckpt, "adamw_torch")


def rec(
    number: int,
    candidate: Candidate,
    outcome: Outcome = Outcome.OK,
    *,
    sps: float | None = 10.0,
    peak_gib: float | None = 1.0,
    spread: float = 0.0,
    steps: int = 5,
) -> TrialRecord:
    result = TrialResult(
        outcome,
        samples_per_s=sps if outcome == Outcome.OK else None,
        peak_memory_bytes=int(peak_gib * GIB) if peak_gib is not None else None,
        step_time_spread=spread,
        # steps as long as the speed says (one sample a step): ratios between records
        # are their speeds'
        step_times_s=(1.0 / sps if sps else 0.1,) * steps,
    )
    return TrialRecord(number, candidate, result)


def word_tokenizer(folder: Path, words: list[str]) -> Path:
    """A word-level tokenizer trained here (no network), saved as transformers loads it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(words, trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>"]))
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")
    wrapped.save_pretrained(str(folder))
    return folder


def _tiny_llama(folder: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)


def loaded_llama(quantized: bool) -> Any:
    """A checkpoint saved in bf16, loaded as a (Q)LoRA script loads it: 4-bit NF4 and
    prepared for k-bit training, or in its stored dtype; LoRA on every linear layer."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    with tempfile.TemporaryDirectory() as folder:
        _tiny_llama(folder)
        if quantized:
            q = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=torch.bfloat16,
                bnb_4bit_use_double_quant=True,
            )
            model = LlamaForCausalLM.from_pretrained(
                folder, quantization_config=q, device_map="cpu"
            )
            model = prepare_model_for_kbit_training(model)
        else:
            model = LlamaForCausalLM.from_pretrained(folder)
    return get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))


def drop_once(monkeypatch: pytest.MonkeyPatch, owner: object, method: str) -> list[str]:
    """The owner's next call of `method` fails as a storage restarting does; the calls."""
    real, calls = getattr(owner, method), []

    def dropped(*args: object, **kwargs: object) -> object:
        calls.append(method)
        if len(calls) == 1:
            raise optuna.exceptions.StorageInternalError("server closed the connection")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, method, dropped)
    return calls
