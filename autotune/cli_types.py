"""The CLI's option types and shared options: each type parses one kind of value, and
its error is the message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from autotune.core.enums import Objective, values
from autotune.core.units import parse_duration, parse_size


class ParsedType(click.ParamType):  # type: ignore[type-arg]
    """An option value parsed by one of our parsers; its ValueError becomes the message."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self.parse = parse

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def fraction(text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not low <= value <= high:  # also refuses nan, which every comparison fails
        raise ValueError(f"{text!r} is not between {low} and {high}")
    return value


SIZE = ParsedType("SIZE", parse_size)
DURATION = ParsedType("DURATION", parse_duration)


class ListType(click.ParamType):  # type: ignore[type-arg]
    """A comma-separated list, each item checked against `choices` when given."""

    name = "LIST"

    def __init__(self, choices: tuple[str, ...] | None = None) -> None:
        self.choices = choices

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        items = tuple(dict.fromkeys(v.strip() for v in str(value).split(",") if v.strip()))
        if not items:
            self.fail("is empty; give a comma-separated list", param, ctx)
        bad = [v for v in items if self.choices and v not in self.choices]
        if bad:
            self.fail(f"{', '.join(bad)} not in {', '.join(self.choices or ())}", param, ctx)
        return items


def study_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--study and --storage, shared by the commands that read a stored study."""
    command = click.option("--storage", help="[default: sqlite:///studies/autotune.db]")(command)
    return click.option("--study", "study_name", required=True)(command)


OBJECTIVE = click.option(
    "--objective",
    default="throughput",
    show_default=True,
    type=click.Choice(values(Objective)),
    help="throughput: the fastest config that fits; efficiency: samples/s per GiB.",
)
