#!/usr/bin/env python
"""A LoRA fine-tune with TRL's SFTTrainer, as you would write it, with the one function
autotune needs: `make_trainer(args) -> SFTTrainer`. Offline: `prepare` writes a small
model (saved with save_pretrained, loaded back with from_pretrained), a tokenizer and
a jsonl dataset under $LORA_SFT_DIR (default ./lora-sft). It needs TRL and PEFT:
`pip install -e ".[peft]"`.

    python examples/lora_sft.py prepare
    autotune search --trainer examples/lora_sft.py:make_trainer \\
        --base-args examples/lora_sft.json --memory-budget 4GiB --time-budget 5m
    python examples/lora_sft.py train studies/lora_sft.best.json

or from Python, the same search (`python examples/lora_sft.py tune`, then `train`):
`autotune.search(make_trainer, base_args=..., memory_budget="4GiB", time_budget="5m")`.

The search calls make_trainer in every probe with the candidate's SFTConfig; the export
is an SFTConfig JSON that `train` reads with HfArgumentParser, your learning rate,
schedule, max_length and dataset_text_field kept.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

from trl import SFTConfig

WORK = Path(os.environ.get("LORA_SFT_DIR", "lora-sft"))
WORDS = (
    "the model reads a batch of text and learns to predict the next token while the "
    "optimizer updates the adapter weights and memory holds activations for every layer"
).split()


def make_trainer(args: SFTConfig):  # -> trl.SFTTrainer
    """Your job: the model from its folder, a LoRA adapter on it, your data."""
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(WORK / "tokenizer")
    model = AutoModelForCausalLM.from_pretrained(WORK / "model")
    data = load_dataset("json", data_files=str(WORK / "train.jsonl"), split="train")
    adapter = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"])
    return SFTTrainer(
        model=model,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=adapter,
    )


def prepare(samples: int = 600) -> None:
    """A byte-level BPE tokenizer and a small Qwen2-style model, both saved to disk, and
    a jsonl dataset of text lines of varied length (use your own instead)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    WORK.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    lines = []
    for _ in range(samples):  # mostly short lines, a few long ones
        n = min(120, int(rng.paretovariate(1.2) * 8))
        lines.append(" ".join(rng.choice(WORDS) for _ in range(n)))
    with open(WORK / "train.jsonl", "w", encoding="utf-8") as out:
        for line in lines:
            out.write(json.dumps({"text": line}) + "\n")
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<pad>", "<unk>", "<eos>"]
    tokenizer.train_from_iterator(
        lines, trainers.BpeTrainer(vocab_size=512, special_tokens=special)
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )
    wrapped.save_pretrained(WORK / "tokenizer")
    config = Qwen2Config(
        vocab_size=len(wrapped),
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=wrapped.pad_token_id,
        eos_token_id=wrapped.eos_token_id,
        bos_token_id=wrapped.eos_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(WORK / "model")
    print(f"wrote {WORK / 'model'}, {WORK / 'tokenizer'} and {WORK / 'train.jsonl'}")


def train(arguments_file: str) -> None:
    """Your training run: the exported SFTConfig, read as any HfArgumentParser script."""
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(SFTConfig).parse_json_file(arguments_file)
    result = make_trainer(args).train()
    loss = result.training_loss
    print(f"trained {result.global_step} steps with {arguments_file}: loss {loss:.3f}")


def tune() -> None:
    """The search from Python: the function itself, your arguments as an SFTConfig."""
    import torch

    import autotune

    with open(Path(__file__).with_name("lora_sft.json"), encoding="utf-8") as file:
        # SFTConfig defaults to bf16, which needs use_cpu on a machine without a GPU
        base = SFTConfig(**json.load(file), use_cpu=not torch.cuda.is_available())
    outcome = autotune.search(make_trainer, base_args=base, memory_budget="4GiB", time_budget="5m")
    args = outcome.arguments()  # an SFTConfig, as `train` reads it from the file
    optim = getattr(args.optim, "value", args.optim)
    split = f"{args.per_device_train_batch_size}x{args.gradient_accumulation_steps}"
    print(f"{outcome.output}: {split}, optim {optim}, bf16 {args.bf16}")


if __name__ == "__main__":
    steps = {"prepare": prepare, "tune": tune, "train": lambda: train(sys.argv[2])}
    if len(sys.argv) < 2 or sys.argv[1] not in steps:
        sys.exit(__doc__)
    steps[sys.argv[1]]()
