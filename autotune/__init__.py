"""autotune: find the fastest Trainer configuration that fits in memory, by measurement."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
