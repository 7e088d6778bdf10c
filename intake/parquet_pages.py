"""The size of a Parquet column chunk's dictionary page, read from its page header.

A dictionary-encoded column stores each distinct value once, so a few KB of file can repeat a megabyte
value on every row; no row can hold a value longer than the dictionary page. The file's footer does not
say that page's size: its header does, a Thrift compact-protocol struct whose field 2 is
`uncompressed_page_size` (parquet-format's PageHeader), the size the reader decompresses it into.
"""

from __future__ import annotations

import io

PAGE_HEADER_PREFIX_BYTES = 32  # fields 1-3 of a PageHeader: three varints and their field headers
COMPACT_I32 = 5  # the Thrift compact protocol's type id of an i32 field
UNCOMPRESSED_PAGE_SIZE_FIELD = 2
VARINT_PAYLOAD_BITS = 7
VARINT_CONTINUES = 0x80
FIELD_DELTA_SHIFT = 4
LOW_NIBBLE = 0x0F


class UnreadablePageHeader(ValueError):
    """The bytes at the offset are not the start of a PageHeader this reader understands."""


def uncompressed_page_bytes(stream: io.BufferedIOBase, offset: int) -> int:
    """The uncompressed size of the page whose header starts at `offset`."""
    stream.seek(offset)
    header = stream.read(PAGE_HEADER_PREFIX_BYTES)
    position, field = 0, 0
    while position < len(header):
        field_header = header[position]
        position += 1
        delta, kind = field_header >> FIELD_DELTA_SHIFT, field_header & LOW_NIBBLE
        if delta == 0 or kind != COMPACT_I32:
            break  # a long-form field header or another type: not the PageHeader's leading i32 fields
        field += delta
        value, position = _zigzag_varint(header, position)
        if field == UNCOMPRESSED_PAGE_SIZE_FIELD:
            if value < 0:
                break
            return value
    raise UnreadablePageHeader(f"no page header at byte {offset}")


def _zigzag_varint(data: bytes, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while position < len(data):
        byte = data[position]
        position += 1
        value |= (byte & ~VARINT_CONTINUES & 0xFF) << shift
        if not byte & VARINT_CONTINUES:
            return (value >> 1) ^ -(value & 1), position
        shift += VARINT_PAYLOAD_BITS
    raise UnreadablePageHeader("a page header cut short")
