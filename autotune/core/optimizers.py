"""The optimizers autotune knows, each declared once.

An optimizer is one record: its name (`TrainingArguments.optim`, what `--optimizers`
takes), the library it needs, whether it is searched by default or for a quantized base,
the memory it holds (the estimate's planned state, the floor it certainly holds, the
32-bit state some keep for embeddings, its step's temporaries), the optimizers that hold
no more than it (the skip rule), and the one whose update it computes (parity's class).
The estimate, the skips, parity, the installed list and the defaults read these records;
an optimizer not declared is planned at `DEFAULT_STATE_BYTES` and is its own arithmetic.

The memory figures follow Hugging Face's single-GPU training guide (state: 8 bytes a
parameter for AdamW, 2 for 8-bit Adam) and what torch 2.13, transformers 5.23 and
bitsandbytes were read and measured to do (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

DEFAULT_STATE_BYTES = 8  # an optimizer not declared: planned as AdamW


def _in_place(parameters: int, largest: int, device_kind: str) -> int:
    return 0


def _torch_adamw_step(parameters: int, largest: int, device_kind: str) -> int:
    """torch's AdamW on CUDA steps each parameter group in one foreach pass whose square
    root of the second moment is a copy of all of it (4 bytes a parameter); on the CPU it
    steps a tensor at a time, sqrt then a division: two copies of the largest."""
    return 4 * parameters if device_kind == "cuda" else 2 * 4 * largest


def _two_of_the_largest(parameters: int, largest: int, device_kind: str) -> int:
    """A tensor at a time, two temporaries (the Trainer's Adafactor: grad**2 + eps, then
    the factored estimate): 1 GiB on mT5-small's shared embedding, which an H100 probe's
    3.72 GiB peak under a 4 GiB budget showed."""
    return 2 * 4 * largest


@dataclasses.dataclass(frozen=True)
class Optimizer:
    name: str  # TrainingArguments.optim
    # The state a trained parameter holds, planned with (None: not measured, planned at
    # DEFAULT_STATE_BYTES and never offered as the lighter choice)
    state_bytes: int | None = None
    # What it certainly holds at its first step, a floor the search skips on with no
    # margin (it must never overstate: factored, paged or unknown state counts 0)
    floor_bytes: int = 0
    # The state of nn.Embedding weights where it differs: the Trainer registers 32-bit
    # state for them under bitsandbytes' 8-bit optimizers (optim_bits=32)
    embedding_state_bytes: int | None = None
    # The temporaries of its step, alive after backward has freed the activations:
    # (trained parameters, the largest tensor's, device kind) -> bytes
    step_temporaries: Callable[[int, int, str], int] = _in_place
    # Optimizers that hold no more memory than this one, all else the same: where one of
    # them ran out of memory at a batch, this one does at that batch and above
    lighter: tuple[str, ...] = ()
    same_update_as: str = ""  # parity: computes this one's update (summed in another order)
    package: str = ""  # the library it needs installed ("": torch's or transformers' own)
    default: bool = False  # searched when --optimizers is not given
    for_quantized_base: bool = False  # searched too for a 4-bit or 8-bit base (bitsandbytes)

    def state(self) -> int:
        return DEFAULT_STATE_BYTES if self.state_bytes is None else self.state_bytes


# The plain default's optimizer: torch's AdamW, the Trainer's default before torch 2.8
# (transformers 5 defaults to the fused one from 2.8; the recipe reads the class).
PLAIN = "adamw_torch"

DECLARED = (
    # AdamW keeps 8 bytes a parameter of state, Adafactor a factored second moment; the
    # step's temporaries are at most two copies of the largest tensor for Adafactor and
    # for torch's AdamW stepping a tensor at a time (CPU; on CUDA its foreach pass copies
    # all of the second moment), none for the fused AdamW updating in place: both hold
    # less than torch's AdamW, Adafactor less than the fused one
    Optimizer(
        PLAIN,
        state_bytes=8,
        floor_bytes=8,
        step_temporaries=_torch_adamw_step,
        lighter=("adamw_torch_fused", "adafactor"),
        default=True,
    ),
    # updates in place; AdamW's sums in another order
    Optimizer(
        "adamw_torch_fused",
        state_bytes=8,
        floor_bytes=8,
        lighter=("adafactor",),
        same_update_as=PLAIN,
        default=True,
    ),
    # The Trainer's Adafactor (beta1 None) keeps a factored second moment, rows and
    # columns, for each matrix: 0.07 GiB on mT5-small's 172M parameters on an H100
    Optimizer("adafactor", state_bytes=1, step_temporaries=_two_of_the_largest, default=True),
    # On mT5, embeddings are 128M of 172M parameters: 8-bit Adam ran out of memory where
    # Adafactor fitted, on the CPU and on an H100 (their state is 32-bit)
    Optimizer(
        "adamw_bnb_8bit",
        state_bytes=2,
        floor_bytes=2,
        embedding_state_bytes=8,
        package="bitsandbytes",
        default=True,
        for_quantized_base=True,
    ),
    Optimizer("adamw_torch_8bit", state_bytes=2, floor_bytes=2, package="torchao", default=True),
    Optimizer(
        "adamw_8bit", state_bytes=2, floor_bytes=2, embedding_state_bytes=8, package="bitsandbytes"
    ),
    # paged: the state may sit in host memory, so its floor is 0
    Optimizer(
        "paged_adamw_8bit",
        state_bytes=2,
        embedding_state_bytes=8,
        package="bitsandbytes",
        for_quantized_base=True,
    ),
    Optimizer("paged_adamw_32bit", package="bitsandbytes", for_quantized_base=True),
    Optimizer("adamw_torch_4bit", state_bytes=1, floor_bytes=1, package="torchao"),
    Optimizer("sgd", state_bytes=0),
    Optimizer("adagrad", state_bytes=4),
    Optimizer("rmsprop", state_bytes=4),
    Optimizer(
        "lion_8bit", state_bytes=1, floor_bytes=1, embedding_state_bytes=4, package="bitsandbytes"
    ),
    Optimizer("lion_32bit", state_bytes=4, floor_bytes=4, package="bitsandbytes"),
    Optimizer("paged_lion_8bit", package="bitsandbytes"),
    Optimizer("paged_lion_32bit", package="bitsandbytes"),
)
BY_NAME = {optimizer.name: optimizer for optimizer in DECLARED}
DEFAULT = tuple(optimizer.name for optimizer in DECLARED if optimizer.default)
FOR_QUANTIZED_BASE = tuple(o.name for o in DECLARED if o.for_quantized_base)
MEASURED = tuple(o.name for o in DECLARED if o.state_bytes is not None)  # the state is known
# transformers names these, but they run only on XLA or Ascend NPUs
NOT_HERE = frozenset({"adamw_torch_xla", "adamw_torch_npu_fused"})


def optimizer(name: str) -> Optimizer:
    """The declaration of `name`; one not declared is planned as AdamW, its own update."""
    return BY_NAME.get(name) or Optimizer(name)
