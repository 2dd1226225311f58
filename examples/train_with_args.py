#!/usr/bin/env python
"""A plain Trainer script, in the style of the Hugging Face examples, that reads its
TrainingArguments from a JSON file, such as the one `autotune search` exports.

    python examples/train_with_args.py studies/mt5-small.best.json
    python examples/train_with_args.py studies/mt5-small.best.json --model_name_or_path ./model
    python examples/train_with_args.py studies/mt5-small.best.json --attn_implementation eager
    python examples/train_with_args.py studies/mt5-small.best.json --flush_denormal

Nothing in it knows about autotune: the exported JSON holds only TrainingArguments
fields. Model and data arguments come from their own dataclasses, as usual; here the
model is built from its config with random weights and the data is synthetic, so the
script runs offline.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        default="google/mt5-small",
        metadata={"help": "A directory with config.json, or an id autotune has a preset for."},
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "eager, sdpa, flash_attention_2, ...: a model argument, not a "
            "TrainingArguments field (autotune's summary lists it under model_arguments)"
        },
    )
    flush_denormal: bool = field(
        default=False,
        metadata={
            "help": "torch.set_flush_denormal(True) at the start: where autotune's "
            "export says this CPU is slow on subnormal numbers your run makes"
        },
    )
    max_seq_length: int = field(default=128)
    max_target_length: int = field(default=32)
    num_examples: int = field(default=256)


def load_config(name: str) -> AutoConfig:
    try:
        return AutoConfig.from_pretrained(name)
    except OSError:  # offline: use the architecture preset autotune ships
        from autotune.hf.models import resolve_model

        values = dict(resolve_model(name).config)
        return AutoConfig.for_model(values.pop("model_type"), **values)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seq_len: int, target_len: int, vocab: int, seq2seq: bool) -> None:
        self.n, self.seq_len, self.target_len = n, seq_len, target_len
        self.vocab, self.seq2seq = vocab, seq2seq

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.seq_len,), generator=g)
        labels = (
            torch.randint(0, self.vocab, (self.target_len,), generator=g) if self.seq2seq else ids
        )
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def main() -> None:
    parser = HfArgumentParser((ModelArguments, TrainingArguments))
    if len(sys.argv) >= 2 and sys.argv[1].endswith(".json"):
        # A JSON file (exported, or your own with tuned fields merged in), and any flags
        # after it, which win.
        with open(sys.argv[1], encoding="utf-8") as handle:
            tuned = json.load(handle)
        flags = [f"--{k}={v}" for k, v in tuned.items()]
        model_args, training_args = parser.parse_args_into_dataclasses(flags + sys.argv[2:])
    else:
        model_args, training_args = parser.parse_args_into_dataclasses()
    if model_args.flush_denormal:
        # before any parallel op: threads started later inherit it, a pool started before not
        torch.set_flush_denormal(True)
    config = load_config(model_args.model_name_or_path)
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    auto = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
    extra = (
        {"attn_implementation": model_args.attn_implementation}
        if model_args.attn_implementation
        else {}
    )
    model = auto.from_config(config, **extra)
    data = RandomTokens(
        model_args.num_examples,
        model_args.max_seq_length,
        model_args.max_target_length,
        config.vocab_size,
        seq2seq,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=data)
    metrics = trainer.train().metrics
    print(json.dumps({k: metrics[k] for k in ("train_samples_per_second", "train_loss")}))


if __name__ == "__main__":
    main()
