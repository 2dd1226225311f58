"""Bad file contents, generated (hypothesis): what a file autotune reads may hold when a
user wrote it by hand, another version wrote it, or a process died writing it.

`bad_content(valid)` draws bytes: empty, binary junk, text that is not UTF-8, any JSON
value (NaN, Infinity, huge and tiny numbers, unicode), nesting deeper than a parser
recurses, an integer longer than Python converts, and, given a valid document, that
document cut short, with keys dropped or added, a value of another type, NaN or a huge
number in place of a value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# the scalars a JSON file may hold, and the non-standard ones Python's json reads
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.tuples(st.integers(19, 400), st.sampled_from([1, -1])).map(lambda p: p[1] * 10 ** p[0])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def deep(depth: int, kind: str) -> bytes:
    """An array or object nested `depth` deep: past the parser's recursion limit."""
    if kind == "[":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


JUNK = st.one_of(
    st.just(b""),
    st.sampled_from([b" ", b"\n", b"\x00", b"null", b"NaN", b"-Infinity", b"[]", b'""', b"{}"]),
    st.binary(max_size=64),
    st.binary(min_size=1, max_size=32).map(lambda b: b"\xff\xfe" + b),  # not UTF-8
    JSON_VALUES.map(_dumps),
    st.builds(deep, st.integers(1_000, 30_000), st.sampled_from("[{")),
    st.integers(4_400, 9_000).map(lambda n: b"9" * n),  # past int's digit limit
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
)


@st.composite
def _mutated(draw: st.DrawFn, valid: dict[str, Any]) -> bytes:
    """`valid` in another version's shape, or with one value of the wrong type."""
    doc = dict(valid)
    keys = sorted(doc)
    how = draw(st.sampled_from(["drop", "add", "retype", "special", "truncate", "nest"]))
    if how == "drop" and keys:
        for key in draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True)):
            del doc[key]
    elif how == "add":
        doc[draw(st.text(min_size=1, max_size=20))] = draw(JSON_VALUES)
    elif how == "retype" and keys:
        doc[draw(st.sampled_from(keys))] = draw(JSON_VALUES)
    elif how == "special" and keys:
        special = [float("nan"), float("inf"), -float("inf"), 10**300, -(10**400), 2**63, -1]
        doc[draw(st.sampled_from(keys))] = draw(st.sampled_from(special))
    elif how == "nest" and keys:
        doc[draw(st.sampled_from(keys))] = json.loads(deep(30, "["))
    text = _dumps(doc)
    if how == "truncate":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    return text


def bad_content(valid: dict[str, Any] | None = None) -> st.SearchStrategy[bytes]:
    """Bytes a file may hold instead of what its reader expects (`valid`, when given,
    is a good document to cut short or turn into another version's)."""
    if valid is None:
        return JUNK
    return st.one_of(JUNK, _mutated(valid))


def examples(n: int) -> settings:
    """`n` generated cases, no deadline (the first may import transformers), no example
    database left in the working tree; a test may take pytest's tmp_path (each example
    writes the same file anew)."""
    return settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def one_line(message: str) -> bool:
    return "\n" not in message.strip() and bool(message.strip())


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The `autotune` command in this process: its exit status and what it said on stderr."""
    from autotune.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return code, capsys.readouterr().err


def refused(code: int, err: str, path: Path) -> bool:
    """The command failed with one line naming `path`, and no traceback."""
    lines = err.strip().splitlines()
    return code != 0 and len(lines) == 1 and lines[0].startswith("error: ") and path.name in err
