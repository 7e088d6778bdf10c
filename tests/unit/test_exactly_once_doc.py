"""docs/exactly-once.md names, for each invariant, the test that proves it: those tests exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "exactly-once.md"
TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")
INVARIANTS_HEADING = "## Invariants and the tests that prove them"


def invariant_rows() -> list[str]:
    section = DOC.read_text().split(INVARIANTS_HEADING, 1)[1].split("\n## ", 1)[0]
    return [
        line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| invariant")
    ]


def test_every_invariant_names_a_test() -> None:
    rows = invariant_rows()

    assert rows
    assert [row for row in rows if not TEST_REFERENCE.search(row)] == []


def test_every_test_the_document_names_exists() -> None:
    missing = [
        f"{path}::{name}" if name else path
        for path, name in TEST_REFERENCE.findall(DOC.read_text())
        if not (ROOT / path).exists() or (name and f"def {name}(" not in (ROOT / path).read_text())
    ]

    assert missing == []
