"""Public names loaded on first use: a package's `__init__` names what it offers without
importing the modules that hold it, so importing a package stays cheap (a probe child
imports `autotune.probe`; `autotune show` must not import torch through `autotune.hf`)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, owners: Mapping[str, str]) -> Callable[[str], Any]:
    """The PEP 562 module `__getattr__` of `package`: a public name (a key of `owners`)
    is read from its module (the value), imported on first use and kept in the package;
    any other name raises AttributeError, so `from package import submodule` still
    imports the submodule."""

    def __getattr__(name: str) -> Any:
        if name not in owners:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(owners[name]), name)
        setattr(sys.modules[package], name, value)  # the next use skips this function
        return value

    return __getattr__
