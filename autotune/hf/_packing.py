"""Whether padding-free batches train a model exactly like padded ones: checked on one
batch before the lever is offered.

A model keeps packed sequences apart when its attention reads the restarting position
ids (transformers' masking utilities do for Llama, Qwen2, GPT-2, GPT-NeoX, ...); one that
does not (OPT, BLOOM, bidirectional encoders) lets tokens attend across sequences, and
its loss differs. The check builds the model with random weights (one layer where the
config allows it, so it is cheap), and compares the loss of three sequences of different
lengths as one padded batch and as one flattened row (DataCollatorWithFlattening). Both
count the same target tokens: the flattened row masks each sequence's first label, which
the causal shift never predicts in the padded batch either.
"""

from __future__ import annotations

import copy
from typing import Any

from autotune.core.trial import ModelSpec
from autotune.hf.models import build_model

# Deferred imports: torch and transformers load only when padding-free is checked; the planner
# imports this module for every search

LENGTHS = (7, 12, 4)
TOLERANCE = 1e-4  # relative: rounding of the same sums in another order
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def packing_error(model: ModelSpec) -> str:
    """ "" when flattened batches give the padded batch's loss; else why not."""
    try:
        padded, flat = losses(model)
    except Exception as exc:  # the model refuses packed inputs
        return f"padding-free batches failed on one batch ({type(exc).__name__}: {exc})"[:200]
    if abs(padded - flat) > TOLERANCE * max(1.0, abs(padded)):
        return (
            f"padding-free batches change the loss ({flat:.6f} against {padded:.6f} padded): "
            "this model's attention does not keep packed sequences apart"
        )
    return ""


def losses(model: ModelSpec) -> tuple[float, float]:
    """(padded loss, flattened loss) of one batch, in fp32, eval mode, no cache."""
    import torch
    from transformers import DataCollatorWithFlattening

    built = _small(model)
    built.eval()
    if getattr(built, "loss_type", None) is None:  # the default, named: transformers warns
        built.loss_type = "ForCausalLM"  # on the user's terminal when it must pick it
    vocab = min(model.vocab_size, 1000)
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in LENGTHS]
    width = max(LENGTHS)
    pad = [width - len(s) for s in sequences]
    padded = {
        "input_ids": torch.tensor([s + [0] * p for s, p in zip(sequences, pad, strict=True)]),
        "attention_mask": torch.tensor(
            [[1] * len(s) + [0] * p for s, p in zip(sequences, pad, strict=True)]
        ),
        "labels": torch.tensor([s + [-100] * p for s, p in zip(sequences, pad, strict=True)]),
    }
    collator = DataCollatorWithFlattening()  # type: ignore[no-untyped-call]
    flat = collator([{"input_ids": s} for s in sequences])
    with torch.no_grad():
        a = built(**padded, use_cache=False).loss
        b = built(**flat, use_cache=False).loss
    return float(a), float(b)


def _small(model: ModelSpec) -> Any:
    """The model with one layer (attention behaves per layer), or whole if that fails."""
    import torch

    torch.manual_seed(0)
    config = copy.deepcopy(model.config)
    for key in LAYER_KEYS:
        if isinstance(config.get(key), int):
            config[key] = 1
    try:
        return build_model(ModelSpec(model.name, model.source, model.task, config))
    except Exception:  # a config whose other fields depend on the layer count
        return build_model(model)
