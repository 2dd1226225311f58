from __future__ import annotations

import pytest

from autotune.core.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GiB", 8 * 2**30),
        ("7500MB", 7_500_000_000),
        ("512mib", 512 * 2**20),
        ("1.5G", int(1.5 * 2**30)),
        ("1024B", 1024),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["8XB", "", "GiB", "-3GiB", "0GiB", "8 G i B", "1024", "0.5"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


@pytest.mark.parametrize("text", ["0.5B", "1" * 401 + "B", "99999999TiB"])
def test_a_size_is_a_whole_positive_number_of_bytes_a_machine_can_have(text: str) -> None:
    """Half a byte is not "no limit", and 401 digits are not an OverflowError."""
    with pytest.raises(ValueError, match=r"byte|large"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"), [("90s", 90), ("10m", 600), ("1h30m", 5400), ("45", 45)]
)
def test_parse_duration(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["-3m", "3x", "m", "0s", "1h 3m", "99999999999"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_formatting() -> None:
    assert format_size(1.5 * 2**30) == "1.5 GiB"
    assert format_size(300 * 2**20) == "300 MiB"
    assert format_size(300 * 2**10) == "300 KiB"  # a LoRA adapter's gradients, not 0 MiB
    assert format_size(512) == "512 B"
    assert format_duration(75) == "1m15s"
