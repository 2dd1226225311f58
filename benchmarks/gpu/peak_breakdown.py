"""Where a CUDA training peak of mT5-small goes: allocated against reserved, backward
against the optimizer step, step by step (needs a GPU; 3 Trainer steps per config, each
in a fresh process, global batch 16, 64/16 tokens).

    python benchmarks/gpu/peak_breakdown.py 1   # five configs, default and expandable allocator
    python benchmarks/gpu/peak_breakdown.py 2   # fp32 AdamW, every batch split, ckpt off/on

Output: benchmarks/gpu/h100_mt5-small_where_the_peak_goes.txt.
"""

import json
import os
import subprocess
import sys

RUN = sys.argv[1] if len(sys.argv) > 1 else "2"
if RUN == "1":
    CONFIGS = [
        (8, "fp32", "adamw_torch", False),
        (16, "fp32", "adamw_torch", False),
        (8, "fp32", "adafactor", False),
        (8, "bf16", "adamw_torch", False),
        (8, "fp32", "adamw_torch_fused", False),
    ]
    ALLOC = ("", "expandable_segments:True")
else:
    CONFIGS = [(b, "fp32", "adamw_torch", ck) for ck in (False, True) for b in (16, 8, 4, 2, 1)]
    ALLOC = ("",)

CHILD = r"""
import json, sys, torch, transformers
from transformers import AutoConfig, AutoModelForSeq2SeqLM, Trainer, TrainingArguments, TrainerCallback
from autotune.hf.models import resolve_model, transformers_config
batch, prec, optim, out, ckpt = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1"
spec = resolve_model("google/mt5-small")
cfg = transformers_config(spec.config)
torch.manual_seed(0)
model = AutoModelForSeq2SeqLM.from_config(cfg, attn_implementation="sdpa")
n = sum(p.numel() for p in model.parameters())
class DS(torch.utils.data.Dataset):
    def __len__(self): return 10000
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(1, cfg.vocab_size, (64,), generator=g),
                "attention_mask": torch.ones(64, dtype=torch.long),
                "labels": torch.randint(1, cfg.vocab_size, (16,), generator=g)}
rec = {"params": n}
class CB(TrainerCallback):
    def on_step_begin(self, *a, **k):
        torch.cuda.synchronize(); rec.setdefault("start_alloc", []).append(torch.cuda.memory_allocated())
        torch.cuda.reset_peak_memory_stats()
    def on_pre_optimizer_step(self, *a, **k):
        torch.cuda.synchronize()
        rec.setdefault("fwd_bwd_peak_alloc", []).append(torch.cuda.max_memory_allocated())
        rec.setdefault("fwd_bwd_peak_reserved", []).append(torch.cuda.max_memory_reserved())
        rec.setdefault("pre_step_alloc", []).append(torch.cuda.memory_allocated())
        torch.cuda.reset_peak_memory_stats()
    def on_optimizer_step(self, *a, **k):
        torch.cuda.synchronize()
        rec.setdefault("step_peak_alloc", []).append(torch.cuda.max_memory_allocated())
        rec.setdefault("step_peak_reserved", []).append(torch.cuda.max_memory_reserved())
args = TrainingArguments(output_dir="/tmp/gapout", per_device_train_batch_size=batch,
    gradient_accumulation_steps=16 // batch, max_steps=3, **{("activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__ else "gradient_checkpointing"): ckpt}, bf16=prec == "bf16", optim=optim,
    report_to=[], logging_strategy="no", save_strategy="no", dataloader_num_workers=0)
Trainer(model=model, args=args, train_dataset=DS(), callbacks=[CB()]).train()
s = torch.cuda.memory_stats()
rec.update({k: s.get(k) for k in ("allocated_bytes.all.peak", "reserved_bytes.all.peak",
    "inactive_split_bytes.all.peak", "num_alloc_retries", "segment.all.peak")})
rec["final_alloc"] = torch.cuda.memory_allocated(); rec["final_reserved"] = torch.cuda.memory_reserved()
json.dump(rec, open(out, "w"))
"""
G = 2**30
res = {}
for conf in ALLOC:
    for b, p, o, ck in CONFIGS:
        out = f"/tmp/gap-{b}-{p}-{o}-{ck}-{bool(conf)}.json"
        env = {**os.environ}
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(b), p, o, out, "1" if ck else "0"],
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            print(b, p, o, conf, "FAILED", done.stderr[-800:])
            continue
        r = json.load(open(out))
        res[f"{b}x{16 // b} {p} {o} ckpt={ck} {conf}"] = r

        def f(k, r=r):
            return "/".join(f"{v / G:.2f}" for v in r[k])

        print(
            f"{b}x{16 // b} {p} {o} ckpt={ck} [{conf or 'default'}] params {r['params'] / 1e6:.0f}M start {f('start_alloc')} | fwd+bwd alloc {f('fwd_bwd_peak_alloc')} resv {f('fwd_bwd_peak_reserved')} | pre-step {f('pre_step_alloc')} | step alloc {f('step_peak_alloc')} resv {f('step_peak_reserved')} | inactive split peak {r['inactive_split_bytes.all.peak'] / G:.2f} retries {r['num_alloc_retries']}",
            flush=True,
        )
json.dump(res, open(os.environ.get("OUT", "/tmp") + "/gap.json", "w"), indent=1)
subprocess.run(
    [
        sys.executable,
        "-m",
        "autotune",
        "estimate",
        "--model",
        "google/mt5-small",
        "--device",
        "cuda",
        "--seq-len",
        "64",
        "--target-len",
        "16",
        "--batch",
        "16",
        "--precisions",
        "fp32",
        "--optimizers",
        "adamw_torch",
    ]
)
