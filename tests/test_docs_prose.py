"""The docs read as written for a newcomer: no sentence of README.md or docs/ runs past 40
words, and the README stays short enough to read (2,500 words) with what it does, the
install and the main command in its first 25 lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT

PROSE = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_WORDS = 40


def sentences(markdown: str) -> list[str]:
    """The sentences of a page's prose: paragraphs and list items, without code blocks
    (fenced or indented by four spaces), tables and headings."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    paragraphs: list[list[str]] = [[]]
    for line in text.splitlines():
        stripped = line.strip()
        skip = line.startswith("    ") and not paragraphs[-1]
        if not stripped or skip or stripped.startswith(("|", "#")):
            paragraphs.append([])
            continue
        if re.match(r"([-*]|\d+\.)\s", stripped):  # a list item starts its own sentence
            paragraphs.append([])
            stripped = re.sub(r"^([-*]|\d+\.)\s+", "", stripped)
        paragraphs[-1].append(stripped)
    found = []
    for lines in paragraphs:
        joined = " ".join(lines)
        # a sentence ends at . ! or ? before a space and a capital, a backtick or a bracket
        found += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[*])", joined) if s]
    return found


def test_a_sentence_is_split_where_a_reader_ends_it() -> None:
    page = "One two. Three `four` five.\n\n- an item. Another\n  line\n\n```\nskip. Me\n```\n"
    assert sentences(page) == ["One two.", "Three `four` five.", "an item.", "Another line"]


@pytest.mark.parametrize("doc", PROSE, ids=lambda p: p.name)
def test_no_sentence_runs_past_forty_words(doc: Path) -> None:
    long = [s for s in sentences(doc.read_text(encoding="utf-8")) if len(s.split()) > MAX_WORDS]
    assert not long, "\n\n".join(f"{len(s.split())} words: {s}" for s in long)


def test_the_readme_is_short_and_opens_with_what_a_user_needs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.split()) <= 2500
    head = "\n".join(readme.splitlines()[:25])
    assert "pip install" in head and "autotune search" in head
