"""Parse and format the sizes and durations users type."""

from __future__ import annotations

import re

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}
MAX_DURATION_S = 366 * 24 * 3600
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)([smh])")


MAX_SIZE = 2**60  # an exbibyte: past any machine's memory


def parse_size(text: str) -> int:
    """'8GiB' -> 8589934592. Raises ValueError with what was wrong.

    A unit is required ('512' alone is refused: bytes or MiB?); the result is a whole,
    positive number of bytes, so '0.5B' is refused rather than read as 0 ("no limit")."""
    match = _SIZE_RE.match(text)
    if not match or not match.group(2) or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(
            f"{text!r} is not a size; write a number and a unit, e.g. 8GiB, 7500MB or 512MiB"
        )
    if len(match.group(1)) > 30:
        raise ValueError(f"{text!r} is too large for a memory size")
    value = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if value < 1:
        raise ValueError(f"{text!r} is less than one byte; give a positive size, e.g. 8GiB")
    if value > MAX_SIZE:
        raise ValueError(f"{text!r} is larger than any machine's memory; e.g. 8GiB")
    return int(value)


def parse_duration(text: str) -> float:
    """'1h30m' -> 5400.0, '90s' -> 90.0, '45' -> 45 seconds."""
    stripped = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", stripped):
        seconds = float(stripped)
    elif stripped and _DURATION_RE.sub("", stripped) == "":
        seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_RE.findall(stripped))
    else:
        raise ValueError(
            f"{text!r} is not a duration; write e.g. 90s, 10m, 1h30m (no sign, no spaces)"
        )
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"{text!r} is longer than a year; give a duration such as 10m or 2h")
    return seconds


def format_size(num_bytes: float) -> str:
    """Bytes as GiB with one decimal (1.5 GiB), else whole MiB, KiB or bytes: a LoRA
    adapter's 300 KiB of gradients is not "0 MiB"."""
    if abs(num_bytes) >= 2**30:
        return f"{num_bytes / 2**30:.1f} GiB"
    if abs(num_bytes) >= 2**20 or num_bytes == 0:
        return f"{num_bytes / 2**20:.0f} MiB"
    if abs(num_bytes) >= 2**10:
        return f"{num_bytes / 2**10:.0f} KiB"
    return f"{num_bytes:.0f} B"


def format_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
