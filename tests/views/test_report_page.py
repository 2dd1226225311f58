"""The report page escapes everything a user supplied."""

from __future__ import annotations

from pathlib import Path

from helpers import SPEC, cand, rec

from autotune.views._insight import insight
from autotune.views.report import _html


def test_a_study_name_cannot_inject_markup_into_the_page(tmp_path: Path) -> None:
    name = 'x"><b onmouseover=alert(1)>'
    image = tmp_path / f"{name}.tradeoff.png"
    image.write_bytes(b"\x89PNG fake")
    records = [rec(1, cand(16), sps=2.0, peak_gib=1.0)]
    page = _html(records, [], SPEC, name, [image], insight(records, SPEC))
    assert "<b onmouseover" not in page and '"><b' not in page
    assert "&lt;b onmouseover=alert(1)&gt;" in page
