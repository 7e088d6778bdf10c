"""Keys from outside (object listings, manifests, dataset metadata) joined onto a local folder."""

from __future__ import annotations

SEPARATOR = "/"
UNSAFE_SEGMENTS = frozenset({"", ".", ".."})


def stays_inside(relpath: str) -> bool:
    """A relative path of plain segments: joined onto any folder, it names a file inside that folder.

    Refused: absolute paths, `..` and `.` segments, empty segments (`a//b`, which two keys could
    share), and backslashes (a separator on some systems)."""
    return (
        bool(relpath)
        and "\\" not in relpath
        and "\0" not in relpath
        and all(part not in UNSAFE_SEGMENTS for part in relpath.split(SEPARATOR))
    )
