"""The README is a front door: short, narrow, and every page it and the docs link to exists and is reached."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 150
MAX_LINE_CHARS = 110
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def relative_links(page: Path) -> list[Path]:
    return [
        (page.parent / target).resolve()
        for target in LINK.findall(page.read_text())
        if not re.match(r"[a-z]+://", target)
    ]


def test_the_readme_is_under_150_lines_none_over_110_characters() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < README_MAX_LINES
    assert [n for n, line in enumerate(lines, start=1) if len(line) > MAX_LINE_CHARS] == []


def test_every_relative_link_of_the_readme_and_the_docs_names_a_file_that_exists() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *(ROOT / "deploy").glob("*.md")]
    broken = [
        f"{page.relative_to(ROOT)} -> {target}"
        for page in pages
        for target in relative_links(page)
        if not target.exists()
    ]
    assert broken == []


def test_every_doc_is_reached_from_the_readme() -> None:
    reached: set[Path] = set()
    frontier = [ROOT / "README.md"]
    while frontier:
        page = frontier.pop()
        for target in relative_links(page):
            if target.suffix == ".md" and target.exists() and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in reached) == []
