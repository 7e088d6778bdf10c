"""Byte counts for people."""

from __future__ import annotations

BYTES_PER_UNIT = 1024
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(count: int) -> str:
    """`52.1 GiB` rather than `55943249920`."""
    value = float(count)
    for unit in _UNITS:
        if abs(value) < BYTES_PER_UNIT or unit == _UNITS[-1]:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= BYTES_PER_UNIT
    raise AssertionError("unreachable")
