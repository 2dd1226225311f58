"""Analytic memory figures from the parameter count, before anything runs.

The pure part (bytes per parameter) is apart from the I/O (counting parameters on the
meta device, which allocates nothing).
"""

from __future__ import annotations

import dataclasses

from autotune.trial import ModelSpec

# Trainer keeps fp32 master weights under fp16/bf16 autocast: 4 bytes either way.
WEIGHT_BYTES = 4
GRADIENT_BYTES = 4
# Optimizer state bytes per parameter.
OPTIMIZER_STATE_BYTES = {
    "adamw_torch": 8,  # two fp32 moments
    "adamw_torch_fused": 8,
    "adamw_bnb_8bit": 2,  # two 8-bit moments
    "adamw_torch_8bit": 2,
    "adafactor": 4,  # factored second moment: about 4 bytes a parameter at most
}


@dataclasses.dataclass(frozen=True)
class ModelSize:
    parameters: int

    @property
    def weights_bytes(self) -> int:
        return self.parameters * WEIGHT_BYTES

    def static_bytes(self, optim: str) -> int:
        """Weights + gradients + optimizer state: what any batch size needs."""
        state = OPTIMIZER_STATE_BYTES.get(optim, 8)
        return self.parameters * (WEIGHT_BYTES + GRADIENT_BYTES + state)


def count_parameters(spec: ModelSpec) -> ModelSize:
    """Parameters of the model, built on the meta device (no memory, no weights)."""
    import torch

    from autotune.models import build_model

    with torch.device("meta"):
        model = build_model(spec)
    return ModelSize(sum(p.numel() for p in model.parameters()))


def check_budget(size: ModelSize, optimizers: tuple[str, ...], budget_bytes: int) -> None:
    """Refuse a budget that no config can meet, saying what would fit instead."""
    from autotune.errors import UsageError
    from autotune.units import format_size

    millions = f"{size.parameters / 1e6:.0f}M parameters"
    if budget_bytes < size.weights_bytes:
        cheapest = min(OPTIMIZER_STATE_BYTES, key=lambda o: size.static_bytes(o))
        raise UsageError(
            f"--memory-budget {format_size(budget_bytes)} is below the "
            f"{format_size(size.weights_bytes)} the fp32 weights alone need ({millions}); "
            f"training needs at least {format_size(size.static_bytes(cheapest))} with "
            f"{cheapest} (weights, gradients, optimizer state) plus activations"
        )
    fitting = [o for o in OPTIMIZER_STATE_BYTES if size.static_bytes(o) < budget_bytes]
    if not any(size.static_bytes(o) < budget_bytes for o in optimizers):
        need = min(size.static_bytes(o) for o in optimizers)
        hint = (
            f"--optimizers {','.join(fitting)} would leave room for activations"
            if fitting
            else "raise --memory-budget"
        )
        raise UsageError(
            f"--memory-budget {format_size(budget_bytes)} cannot hold the weights, gradients "
            f"and optimizer state of any optimizer searched ({format_size(need)} at least for "
            f"{millions}); {hint}, with --checkpointing on and a smaller --global-batch-size"
        )
