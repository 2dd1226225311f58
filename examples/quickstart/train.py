# train.py: LoRA on a small chat model with TRL, and the function autotune calls
import os
import sys

from datasets import load_dataset
from peft import LoraConfig
from transformers import HfArgumentParser
from trl import SFTConfig, SFTTrainer

# offline, a local model folder and data folder instead (the tests use tiny ones)
MODEL = os.environ.get("TRAIN_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")
DATA = os.environ.get("TRAIN_DATA", "trl-lib/Capybara")


def make_trainer(args: SFTConfig) -> SFTTrainer:  # build everything around `args`
    return SFTTrainer(
        model=MODEL,
        args=args,
        train_dataset=load_dataset(DATA, split="train"),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"),
    )


if __name__ == "__main__":  # python train.py args.json (autotune only imports the file)
    (args,) = HfArgumentParser(SFTConfig).parse_json_file(sys.argv[1])
    make_trainer(args).train()
