"""Every `DRAFTGEN_*` variable draftgen reads (each setting's, and any named in the code) is in the table
of docs/configuration.md."""

from __future__ import annotations

import re
from pathlib import Path

from workers.settings import known_variables

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("producer", "workers", "inference")
VARIABLE = re.compile(r"DRAFTGEN_[A-Z0-9_]+")


def test_the_configuration_doc_names_every_variable_the_code_reads() -> None:
    named_in_code = {
        name
        for package in SHIPPED
        for path in (ROOT / package).rglob("*.py")
        for name in VARIABLE.findall(path.read_text())
        if not name.endswith("_")  # a prefix, as in DRAFTGEN_UPLOAD_*
    }
    page = (ROOT / "docs" / "configuration.md").read_text()
    table = "\n".join(line for line in page.splitlines() if line.startswith("| `"))

    assert sorted((named_in_code | known_variables()) - set(VARIABLE.findall(table))) == []
