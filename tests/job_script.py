"""A user's own LoRA + SFTTrainer script, as the tests of `--trainer` search it: a small
Llama saved with save_pretrained and loaded back with from_pretrained, a byte-level
tokenizer and a jsonl dataset, all written offline by `write_job`.

Every call of a factory appends a line to calls.log beside the script (its process and
the arguments it was given), so a test can tell that the probes called it."""

from __future__ import annotations

import contextlib
import importlib
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCRIPT = """
import os
from pathlib import Path

from trl import SFTConfig

HERE = Path(__file__).parent
BITS = 4  # the QLoRA factory's base: 4-bit NF4, or 16 (the bf16 checkpoint as stored)
ATTENTION = None  # the QLoRA factory's attention kernel (None: transformers' default)


def _optim(args):
    return getattr(args.optim, "value", args.optim)


def _log(args):
    with open(HERE / "calls.log", "a") as out:
        out.write(f"{os.getpid()} {args.per_device_train_batch_size} {_optim(args)}\\n")


def make_trainer(args: SFTConfig):
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    _log(args)
    if os.environ.get("JOB_REFUSES") == _optim(args):
        raise RuntimeError(f"this job cannot run {_optim(args)}")
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(HERE / "model"),
        args=args,
        train_dataset=load_dataset("json", data_files=str(HERE / "train.jsonl"), split="train"),
        processing_class=AutoTokenizer.from_pretrained(HERE / "tokenizer"),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    if os.environ.get("JOB_LOG_BATCHES"):  # the real length of each sample trained on
        collate = trainer.data_collator

        def logged(features):
            with open(HERE / "batches.log", "a") as out:
                out.write(" ".join(str(len(f["input_ids"])) for f in features) + "\\n")
            return collate(features)

        trainer.data_collator = logged
    return trainer


def qlora(args: SFTConfig):
    # QLoRA as its guides write it: a bf16 checkpoint loaded in 4-bit NF4 (bf16
    # compute), prepared for k-bit training, LoRA on every linear layer
    import torch
    from datasets import load_dataset
    from peft import LoraConfig, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
    from trl import SFTTrainer

    _log(args)
    if BITS == 4:
        quantized = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
        )
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = AutoModelForCausalLM.from_pretrained(
            HERE / "model-bf16",
            quantization_config=quantized,
            device_map=device,
            attn_implementation=ATTENTION,
        )
        model = prepare_model_for_kbit_training(model)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            HERE / "model-bf16", attn_implementation=ATTENTION
        )
    return SFTTrainer(
        model=model,
        args=args,
        train_dataset=load_dataset("json", data_files=str(HERE / "train.jsonl"), split="train"),
        processing_class=AutoTokenizer.from_pretrained(HERE / "tokenizer"),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
    )


def evaluating(args: SFTConfig):
    # the job with an evaluation set and a metric that needs the logits: the Trainer
    # keeps every evaluation batch's logits (fp32, length x vocabulary a sample) to the end
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    _log(args)
    return SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(HERE / "model"),
        args=args,
        train_dataset=load_dataset("json", data_files=str(HERE / "train.jsonl"), split="train"),
        eval_dataset=load_dataset(
            "json", data_files=str(HERE / os.environ.get("JOB_EVAL", "eval.jsonl")), split="train"
        ),
        processing_class=AutoTokenizer.from_pretrained(HERE / "tokenizer"),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        compute_metrics=_accuracy,
    )


def _accuracy(prediction):
    logits, labels = prediction.predictions, prediction.label_ids
    return {"accuracy": float((logits[:, :-1].argmax(-1) == labels[:, 1:]).mean())}


def gathering(args: SFTConfig):
    # a save that needs memory of its own, as ZeRO-3's gathering of the full weights
    # does: JOB_GATHER_MIB MiB held while the checkpoint is written
    trainer = make_trainer(args)

    class Gathering(type(trainer)):
        def _save_checkpoint(self, model, trial):
            full = bytearray(int(os.environ.get("JOB_GATHER_MIB", "0")) * 2**20)
            super()._save_checkpoint(model, trial)
            del full

    trainer.__class__ = Gathering
    return trainer


def untyped(args):  # the arguments class must come from --args-class
    return make_trainer(args)


def not_a_trainer(args):
    return {"model": None}


def ignores_args(args):
    return make_trainer(SFTConfig(**{**args.to_dict(), "per_device_train_batch_size": 3}))


def raises(args):
    raise ValueError("the tokenizer folder is missing")
"""

EVAL_ROWS = 2048
WORDS = "the model reads text and learns the next token while the adapter trains".split()


@contextlib.contextmanager
def imported(folder: Path) -> Iterator[Any]:
    """The job script `write_job` wrote in `folder`, imported as the user's own script
    runs it (and forgotten afterwards, so the next test imports its own)."""
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module("job")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("job", None)


def byte_tokenizer() -> Any:
    """A byte-level tokenizer with no merges: every byte a token, trained on nothing."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<eos>", pad_token="<pad>", bos_token="<bos>"
    )


def write_job(folder: Path) -> Path:
    """The script, its model (fp32, and the same stored in bf16), tokenizer and data
    under `folder`; returns the script."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = byte_tokenizer()
    tokenizer.save_pretrained(str(folder / "tokenizer"))

    def config(width: int) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )

    LlamaForCausalLM(config(32)).save_pretrained(str(folder / "model"))
    # stored in bf16, as most checkpoints are now; 128 wide: bitsandbytes' CPU kernel for
    # evaluation packs a 4-bit layer's outputs in blocks of 32 (2 heads of 32 here)
    bf16 = LlamaForCausalLM(config(128)).to(torch.bfloat16)
    bf16.save_pretrained(str(folder / "model-bf16"))
    rng = random.Random(0)
    with open(folder / "train.jsonl", "w", encoding="utf-8") as out:
        for _ in range(120):  # lines of 2 to 20 words: the longest set the probes' peak
            words = [rng.choice(WORDS) for _ in range(rng.randint(2, 20))]
            out.write(json.dumps({"text": " ".join(words)}) + "\n")
    with open(folder / "eval.jsonl", "w", encoding="utf-8") as out:
        for _ in range(EVAL_ROWS):  # the evaluating factory's held-out set
            words = [rng.choice(WORDS) for _ in range(rng.randint(10, 20))]
            out.write(json.dumps({"text": " ".join(words)}) + "\n")
    script = folder / "job.py"
    script.write_text(SCRIPT, encoding="utf-8")
    return script


BASE_ARGS = {
    "output_dir": "runs/mine",
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "learning_rate": 0.001,
    "lr_scheduler_type": "cosine",
    "max_steps": 30,
    "max_length": 64,
    "dataset_text_field": "text",
    "bf16": False,
}


CHAT_TEMPLATE = (
    "{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}<eos>"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def write_chat_job(folder: Path) -> tuple[Path, Path]:
    """What the README's quick start downloads, tiny and offline: a chat model folder (a
    small Qwen2 stored in bf16 beside its tokenizer, which has a chat template) and a data
    folder whose train.jsonl holds conversations as TRL's chat data sets do. Returns the
    model folder and the data folder (the quick start's TRAIN_MODEL and TRAIN_DATA)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model_dir, data_dir = folder / "chat-model", folder / "chat-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    rng = random.Random(0)
    with open(data_dir / "train.jsonl", "w", encoding="utf-8") as out:
        for _ in range(64):
            turns = [
                {"role": role, "content": " ".join(rng.choices(WORDS, k=rng.randint(2, 12)))}
                for role in ("user", "assistant")
            ]
            out.write(json.dumps({"messages": turns}) + "\n")
    return model_dir, data_dir
