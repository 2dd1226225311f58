#!/usr/bin/env python
"""How much of the GPU does the pick use? Its model FLOP utilisation (MFU) through the
plain Trainer, beside the plain default's and a strong hand-set config's, on a
Llama-style model of 1.24B parameters (Llama 3.2 1B's shape, random weights from its
config), 2048 tokens a sample: full fine-tuning, and a LoRA adapter (r 16) on every
linear layer.

For each: `autotune search --time-budget` on the device, the user's recipe bf16 AdamW
(`--recipe fp32`: the Trainer's defaults; on 2026-11-30 an H200 measured this table so,
and the searches exported bf16 over fp32 unconfirmed, fixed since: a 2-minute search
should now keep fp32, which no GPU has run yet), then three configs trained by
a plain Trainer in interleaved rounds (benchmarks/_train_child.py, each run its own
process, each step's end taken after the GPU's queued work), all at the same global
batch:

- the plain default: per-device 8, fp32, the Trainer's default optimizer (fused AdamW
  under torch 2.8 and later), the model's default attention;
- hand-set: 8 a device, bf16, fused AdamW, Liger where liger-kernel imports,
  flash-attention-2 where flash-attn is installed (else sdpa, whose CUDA kernel is a
  flash one), torch.compile;
- the export: its training arguments and the attention its script loads the model with.

MFU: the model's training FLOPs a sample (autotune.probe.flops: 2 x every matmul weight
x tokens forward, the LM head's too, attention's whole square; the backward twice that,
a frozen weight's once: torchtitan's 6N + 12LHQT for full fine-tuning) times samples/s,
over the device's dense bf16 peak: the datasheet's (989 TFLOP/s for an H100 SXM or an
H200), and beside it an 8192-square bf16 matmul measured here after the runs. The records
#68 names to aim at: 33-39% for Llama 3.1 8B with FSDP on H100s (torchtitan), up to 47%
(Megatron), 57.8% for a 7B on one H200 in a PyTorch-native stack; larger models on longer
sequences, so a 1B whose LM head is a fifth of its FLOPs sits lower.

    python benchmarks/mfu.py --device cuda --modes lora   # 5m36s on an H200
    python benchmarks/mfu.py --device cuda --modes full   # 4m18s
    python benchmarks/mfu.py --quick                      # a tiny Llama on the CPU: the plumbing
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

from harness import (
    Benchmark,
    Figures,
    exported_with_model,
    header,
    model_folder,
    run,
    search,
    side_by_side,
    table,
    trainer_spec,
)

from autotune.hf.peft import parse_lora

LLAMA_1B = {  # Llama 3.2 1B's shape: 1.24B parameters, its embedding tied to the LM head
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "max_position_embeddings": 4096,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}
TINY = {**LLAMA_1B, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2}
TINY |= {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}
# the adapter as the search's --lora takes it, and as the Trainer runs wrap the model in
LORA_FLAG = (
    "r=16,alpha=32,dropout=0,targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
)
MODES = ("full", "lora")

# Dense bf16 tensor-core peaks from NVIDIA's datasheets (FLOP/s), by the device's name
DATASHEET: tuple[tuple[str, float], ...] = (
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("A100", 312e12),
)


def datasheet_peak(name: str) -> float | None:
    return next((peak for part, peak in DATASHEET if part in name), None)


def hand_set(per_device: int, accumulation: int, device: str) -> dict[str, Any]:
    """What an engineer who knows the levers sets by hand, where this machine has them."""
    flash = device == "cuda" and importlib.util.find_spec("flash_attn") is not None
    liger = device == "cuda" and _imports("liger_kernel.transformers")
    args: dict[str, Any] = {"per_device_train_batch_size": per_device}
    args["gradient_accumulation_steps"] = accumulation
    args |= {"bf16": True, "optim": "adamw_torch_fused", "torch_compile": True}
    if liger:
        args["use_liger_kernel"] = True
    return {"args": args, "attention": "flash_attention_2" if flash else "sdpa"}


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # whatever stops the import, the lever is not at hand
        return False
    return True


def measure_mode(args: argparse.Namespace, work: Path, mode: str, peak: float | None) -> Figures:
    model, seq_len = (TINY, 128) if args.quick else (LLAMA_1B, args.seq_len)
    budget = "1m" if args.quick else args.time_budget
    per_device = min(8, args.global_batch)
    plain = {"per_device_train_batch_size": per_device}
    plain["gradient_accumulation_steps"] = args.global_batch // per_device
    study = f"llama-{mode}"
    model_folder(work, "llama", model)
    lora = ("--lora", LORA_FLAG) if mode == "lora" else ()
    recipe = work / "recipe.json"  # the user's arguments: bf16, or the Trainer's defaults
    recipe.write_text(json.dumps({"bf16": True} if args.recipe == "bf16" else {}))
    searched = search(
        work,
        study,
        *("--model", str(work / "llama"), "--device", args.device, *lora),
        *("--base-args", str(recipe)),
        *("--seq-len", str(seq_len), "--global-batch-size", str(args.global_batch)),
        *("--time-budget", budget, "--quiet"),
        stamped=True,
    )
    ways = {
        "plain default": {"args": plain, "attention": None},
        "hand-set": hand_set(per_device, args.global_batch // per_device, args.device),
        "autotune": exported_with_model(work, study),
    }

    def spec(way: dict[str, Any]) -> dict[str, Any]:
        fields = {"attn_implementation": way["attention"], "flops": True}
        if mode == "lora":
            fields["adapter"] = parse_lora(LORA_FLAG)
        trained = {**way["args"], "use_cpu": args.device == "cpu"}
        return trainer_spec(model, "causal-lm", seq_len, trained, args.steps, None, **fields)

    def said(result: dict[str, Any]) -> str:  # each run's MFU as it ends: a cut run keeps it
        speed, flops = result.get("steady_samples_per_s"), result.get("model_flops_per_sample")
        return f", MFU {speed * flops / peak:.1%}" if speed and flops and peak else ""

    runs = side_by_side(work, ways, spec, args.rounds, said)
    return {
        "seq_len": seq_len,
        "search_wall_s": searched.wall_s,
        "probes": len(searched.probes),
        "trials": searched.probes,  # as show gives them: config, outcome, speed, peak
        "search_log": searched.output.splitlines(),  # whole: what it tried, and why
        "ways": {name: {**way, "runs": runs[name]} for name, way in ways.items()},
    }


def measure(args: argparse.Namespace, work: Path) -> Figures:
    import torch

    figures: Figures = {"device": args.device, "global_batch": args.global_batch}
    figures |= {"steps": args.steps, "rounds": args.rounds}
    figures["time_budget"] = "1m" if args.quick else args.time_budget
    figures["recipe"] = args.recipe
    if args.device == "cuda":
        figures["gpu"] = torch.cuda.get_device_name()
        figures["datasheet_peak"] = datasheet_peak(figures["gpu"])
    for mode in args.modes:
        (work / mode).mkdir()
        figures[mode] = measure_mode(args, work / mode, mode, figures.get("datasheet_peak"))
    figures["measured_peak"] = bf16_peak(args.device)  # last: the runs had the device alone
    return figures


def bf16_peak(device: str, repeats: int = 20) -> float:
    """FLOP/s of a square bf16 matmul (8192 on a GPU, 512 on the CPU), `repeats` of them
    after 3 warm-ups, the device synchronised only at each end."""
    import time

    import torch

    size = 8192 if device == "cuda" else 512
    a, b = (torch.randn(size, size, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - started)


def report(f: Figures) -> str:
    text = header(f, "The pick's MFU beside the plain default's and a hand-set config's")
    shape = "A tiny Llama" if f["quick"] else "Llama 3.2 1B's shape"
    text += (
        f"\n{shape}, random weights, {f['global_batch']} samples a step, {f['steps']} steps "
        f"a run (the steps after the first two timed), {f['rounds']} round(s); `autotune "
        f"search --time-budget {f['time_budget']}` on {f['device']} ({f.get('gpu', 'the CPU')}),"
        f" the recipe {f.get('recipe', 'fp32')} AdamW."
        f" MFU against the datasheet's dense bf16 peak ({_tflops(f.get('datasheet_peak'))}) "
        f"and against a bf16 matmul measured here ({_tflops(f['measured_peak'])}). The "
        "records: 33-39% (torchtitan, Llama 3.1 8B, FSDP, H100), up to 47% (Megatron), "
        "57.8% (a 7B on one H200).\n\n"
    )
    rows = []
    for mode in (m for m in MODES if m in f):
        ways = f[mode]["ways"]
        default, hand = _speed(ways["plain default"]), _speed(ways["hand-set"])
        rows += [(mode, name, *_cells(way, f, default, hand)) for name, way in ways.items()]
    columns: tuple[str, ...] = ("job", "way", "config", "samples/s", "vs default")
    columns += ("vs hand-set", "MFU (datasheet)")
    columns += ("MFU (measured peak)", "peak memory (GPU, else resident)", "outcome")
    text += table(columns, rows)
    for mode in (m for m in MODES if m in f):
        text += f"\n{mode}: the search took {f[mode]['search_wall_s']} s"
        text += f", {f[mode]['probes']} probes. Of the hand-set config's levers it did not offer:"
        left = f[mode]["ways"]["autotune"]["not_offered"]
        said = [f"{k} ({left[k]})" for k in ("torch_compile", "use_liger_kernel") if k in left]
        text += " " + ("; ".join(said) if said else "none") + ".\n"
    return text


def _speed(way: Figures) -> float | None:
    speeds = [r["steady_samples_per_s"] for r in way["runs"] if r.get("steady_samples_per_s")]
    return sum(speeds) / len(speeds) if speeds else None


def _cells(way: Figures, f: Figures, default: float | None, hand: float | None) -> tuple[str, ...]:
    config = ", ".join(f"{k}={v}" for k, v in sorted(way["args"].items()))
    config += f", attention {way['attention'] or 'the default'}"
    speed = _speed(way)
    if speed is None:
        failed = way["runs"][0] if way["runs"] else {"outcome": "not run"}
        said = f"{failed['outcome']}: {failed.get('error', '')}"[:160]
        return (config, "-", "-", "-", "-", "-", "-", said)
    runs = [r for r in way["runs"] if r.get("steady_samples_per_s")]
    achieved = speed * runs[0]["model_flops_per_sample"]
    peaks = (f.get("datasheet_peak"), f["measured_peak"])
    mfus = [f"{achieved / peak:.1%}" if peak else "-" for peak in peaks]
    memory = max(r.get("peak_gpu_bytes", r["peak_rss_bytes"]) for r in runs) / 2**30
    ratios = [f"{speed / base:.2f}x" if base else "-" for base in (default, hand)]
    ok = f"ok, {len(runs)} run(s)"
    return (config, f"{speed:.2f}", *ratios, *mfus, f"{memory:.1f} GiB", ok)


def _tflops(peak: float | None) -> str:
    return f"{peak / 1e12:.3g} TFLOP/s" if peak else "unknown for this device"


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or not set(modes) <= set(MODES):
        raise argparse.ArgumentTypeError(f"{text!r}: give lora, full or lora,full")
    return modes


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--modes", default="lora,full", type=_modes, help="the jobs to run, of lora and full"
    )
    parser.add_argument("--global-batch", type=int, default=16, help="samples an optimizer step")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens a sample")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps a Trainer run")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds of the three")
    parser.add_argument("--time-budget", default="2m", help="each search's --time-budget")
    parser.add_argument(
        "--recipe",
        default="bf16",
        choices=("bf16", "fp32"),
        help="the arithmetic the search is given as the user's (--base-args): bf16 AdamW, "
        "as a 1B fine-tune on a GPU is set; fp32, the Trainer's defaults, from which a "
        "change to bf16 needs paired rounds a 2-minute search has no time for",
    )


if __name__ == "__main__":
    run(Benchmark("mfu", __doc__, measure, report, options))
