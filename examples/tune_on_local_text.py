#!/usr/bin/env python
"""Tune on your own text with no network: a tokenizer trained here, a search, a training run.

    python examples/tune_on_local_text.py WORKDIR            # all three steps
    python examples/tune_on_local_text.py WORKDIR --step prepare|tune|train

prepare: writes a small text dataset (WORKDIR/corpus.txt, lines of varied length; use
         your own file instead), trains a byte-level BPE tokenizer on it with the
         `tokenizers` library (WORKDIR/tokenizer) and writes a small GPT-2 config sized
         to that vocabulary (WORKDIR/model).
tune:    autotune search --dataset corpus.txt --tokenizer tokenizer: the lengths of the
         text set --seq-len, and length-grouped sampling is one of the searched choices.
train:   trains on the same text with the exported studies/local-text.best.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

WORDS = (
    "the model reads a batch of text and learns to predict the next token while the "
    "optimizer updates weights in fp32 or bf16 and memory holds activations gradients "
    "and optimizer state for every layer of the network"
).split()
STUDY = "local-text"


def prepare(work: Path, lines: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    corpus = work / "corpus.txt"
    with open(corpus, "w", encoding="utf-8") as out:
        for _ in range(lines):  # mostly short lines, a few long ones: padding matters
            n = min(200, int(rng.paretovariate(1.2) * 6))
            out.write(" ".join(rng.choice(WORDS) for _ in range(n)) + "\n")
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<pad>", "<unk>", "<eos>"])
    tokenizer.train([str(corpus)], trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )
    wrapped.save_pretrained(str(work / "tokenizer"))
    (work / "model").mkdir(exist_ok=True)
    config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 512,
        "vocab_size": len(wrapped),
        "bos_token_id": wrapped.eos_token_id,
        "eos_token_id": wrapped.eos_token_id,
        "pad_token_id": wrapped.pad_token_id,
    }
    (work / "model" / "config.json").write_text(json.dumps(config, indent=2))
    print(f"wrote {corpus} ({lines} lines), {work / 'tokenizer'}, {work / 'model'}")


def tune(work: Path, max_trials: int) -> None:
    command = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        "--model",
        "./model",
        "--dataset",
        "corpus.txt",
        "--tokenizer",
        "./tokenizer",
        "--study",
        STUDY,
        "--global-batch-size",
        "16",
        "--precisions",
        "fp32,bf16",
        "--optimizers",
        "adamw_torch",
        "--checkpointing",
        "off",
        "--max-trials",
        str(max_trials),
        "--warmup-steps",
        "1",
        "--measure-steps",
        "3",
        "--confirm-top",
        "1",
        "--quiet",
        # kept plain in this demo: a cold compilation costs ~25 s a probe on a CPU, and
        # train() below batches with padding (a padding-free export would need
        # DataCollatorWithFlattening there; see examples/README.md)
        "--lever",
        "torch_compile=false",
        "--lever",
        "padding_free=false",
    ]
    subprocess.run(command, cwd=work, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def train(work: Path, steps: int) -> None:
    """A user's own training script: it reads the exported JSON and nothing else."""
    from datasets import load_dataset
    from transformers import (
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        GPT2Config,
        GPT2LMHeadModel,
        HfArgumentParser,
        Trainer,
        TrainingArguments,
    )

    exported = work / "studies" / f"{STUDY}.best.json"
    (args,) = HfArgumentParser(TrainingArguments).parse_json_file(str(exported))
    args.output_dir, args.max_steps, args.report_to = str(work / "run"), steps, []
    tokenizer = AutoTokenizer.from_pretrained(str(work / "tokenizer"))
    summary = json.loads((work / "studies" / f"{STUDY}.best.summary.json").read_text())
    seq_len = summary["seq_len"]  # the longest sequence the search measured with
    text = load_dataset("text", data_files=str(work / "corpus.txt"), split="train")
    data = text.map(
        lambda rows: tokenizer(rows["text"], truncation=True, max_length=seq_len),
        batched=True,
        remove_columns=["text"],
    )
    model = GPT2LMHeadModel(GPT2Config.from_pretrained(str(work / "model")))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    result = Trainer(model=model, args=args, train_dataset=data, data_collator=collator).train()
    print(f"trained {steps} steps with {exported.name}: loss {result.training_loss:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--step", choices=("prepare", "tune", "train", "all"), default="all")
    parser.add_argument("--lines", type=int, default=400)
    parser.add_argument("--max-trials", type=int, default=6)
    parser.add_argument("--train-steps", type=int, default=10)
    options = parser.parse_args()
    work = options.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    if options.step in ("prepare", "all"):
        prepare(work, options.lines)
    if options.step in ("tune", "all"):
        tune(work, options.max_trials)
    if options.step in ("train", "all"):
        train(work, options.train_steps)


if __name__ == "__main__":
    main()
