"""A JSON object checked against the fields a frozen dataclass declares, before the
dataclass is built from it: what another process, another version or a damaged file
wrote is refused with what is wrong, not carried on to fail later, far from the file."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any


def check_fields(cls: type, raw: Any) -> dict[str, Any]:
    """`raw` when it is a JSON object of `cls`'s fields, each of its declared type (an
    int a 64-bit integer; an int where a float goes; an enum by its value; a list where a
    tuple goes); ValueError naming the first thing wrong. Fields without a default must be
    there."""
    if not isinstance(raw, dict):
        raise ValueError(f"{_short(raw)} is not a JSON object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"unknown field {_short(unknown[0])}")
    for name, field in fields.items():
        required = field.default is dataclasses.MISSING and (
            field.default_factory is dataclasses.MISSING
        )
        if required and name not in raw:
            raise ValueError(f"no {name}")
    hints = typing.get_type_hints(cls)
    for name, value in raw.items():
        if not _fits(value, hints[name]):
            raise ValueError(f"{name} is {_short(value)}, not {_describe(hints[name])}")
    return raw


def _fits(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:  # a count a 64-bit machine keeps, not any integer JSON can spell
        return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    if hint is float:  # an int too, where float() takes it
        if isinstance(value, int) and not isinstance(value, bool):
            return abs(value) < 2**1023
        return isinstance(value, float)
    if hint is str:
        return isinstance(value, str)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return any(value == member.value for member in hint)
    if origin is tuple or origin is list:
        if not isinstance(value, list | tuple):
            return False
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            return all(_fits(v, args[0]) for v in value)
        return len(value) == len(args) and all(
            _fits(v, a) for v, a in zip(value, args, strict=True)
        )
    if origin is dict:
        return isinstance(value, dict) and all(
            _fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items()
        )
    return True  # a nested value (a dataclass): its own reader checks it


def _describe(hint: Any) -> str:
    text = str(hint).replace("typing.", "")
    return hint.__name__ if isinstance(hint, type) else text


def _short(value: Any) -> str:
    """A value as the message shows it: one line, at most 60 characters."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**40 else "a huge number"
    return text if len(text) <= 60 else text[:57] + "..."
