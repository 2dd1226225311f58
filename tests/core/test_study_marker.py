"""The STUDY marker a study's folder holds (`core/paths.claim_folder`), with bad content,
generated: the folder is the study's, or another's said in one line; never a
traceback, never the marker changed."""

from __future__ import annotations

from pathlib import Path

import pytest
from bad_files import bad_content, examples, one_line
from hypothesis import given

from autotune.core.errors import UsageError
from autotune.core.paths import claim_folder

URL = "sqlite:///studies/autotune.db"


@examples(150)
@given(content=bad_content())
def test_a_marker_of_any_bytes_is_ours_or_refused_in_one_line(
    tmp_path: Path, content: bytes
) -> None:
    (tmp_path / "STUDY").write_bytes(content)
    try:
        claim_folder(tmp_path, "mine", URL)
    except UsageError as exc:
        assert one_line(str(exc)) and str(tmp_path) in str(exc), str(exc)
    assert (tmp_path / "STUDY").read_bytes() == content


def test_a_marker_that_is_no_utf8_is_another_studys() -> None:
    """Found by the generated cases: a UnicodeDecodeError escaped, and a marker with a
    line break made the error two lines."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        for content in (b"\xff\xfe", b"other 1234\nmore"):
            (Path(folder) / "STUDY").write_bytes(content)
            with pytest.raises(UsageError, match="holds the files of another study") as info:
                claim_folder(Path(folder), "mine", URL)
            assert one_line(str(info.value))
        claim_folder(Path(folder) / "new", "mine", URL)  # the study's own: written, then read
        claim_folder(Path(folder) / "new", "mine", URL)
