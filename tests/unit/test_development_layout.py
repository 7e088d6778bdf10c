"""docs/development.md's layout names only files and folders that exist, and every package of the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "core",
    "inference",
    "intake",
    "node",
    "workers",
    "producer",
    "devstack",
)  # tests/unit/test_layers.py
BULLET = re.compile(r"^- `([\w/]+?)/`: (.*?)(?=^- |\Z)", re.MULTILINE | re.DOTALL)
NAMED = re.compile(r"`([\w/.]+(?:\.py|/))`")


def layout_bullets() -> dict[str, str]:
    development = (ROOT / "docs" / "development.md").read_text()
    section = development.split("Layout, lowest layer first", 1)[1].split("\n\n", 1)[0]
    return {package: text for package, text in BULLET.findall(section)}


def test_the_layout_lists_every_package_lowest_first() -> None:
    assert list(layout_bullets()) == list(PACKAGES)


def test_every_module_or_folder_the_layout_names_exists_in_its_package() -> None:
    missing = [
        f"{package}/{name}"
        for package, text in layout_bullets().items()
        for name in NAMED.findall(text)
        if not (ROOT / package / name).exists() and not (ROOT / name).exists()
    ]

    assert missing == []
