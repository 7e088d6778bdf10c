"""The bytes of each row of an Arrow record batch, computed from its buffers without turning it into Python.

A string or binary cell counts its bytes, a fixed-width cell its width, a list or struct the sum of what it
holds, a dictionary-encoded cell the size of its value (so a value repeated on every row counts on every
row: that is what it costs once turned into Python). Nulls count nothing.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

BITS_PER_BYTE = 8


def row_sizes_bytes(batch: pa.RecordBatch) -> list[int]:
    """One size per row of the batch, in bytes."""
    total = pa.array([0] * batch.num_rows, pa.int64())
    for column in batch.columns:
        total = pc.add(total, _cell_sizes(column))
    sizes: list[int] = total.to_pylist()
    return sizes


def _cell_sizes(array: pa.Array) -> pa.Array:
    kind = array.type
    if pa.types.is_dictionary(kind):
        return pc.take(_cell_sizes(array.dictionary), array.indices).fill_null(0)
    if (
        pa.types.is_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_string(kind)
        or (pa.types.is_large_binary(kind))
    ):
        return pc.cast(pc.binary_length(array), pa.int64()).fill_null(0)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        return _summed_per_list(array)
    if pa.types.is_struct(kind):
        total = pa.array([0] * len(array), pa.int64())
        for field in array.flatten():
            total = pc.add(total, _cell_sizes(field))
        return pc.if_else(array.is_valid(), total, 0)
    if pa.types.is_null(kind):
        return pa.array([0] * len(array), pa.int64())
    try:
        width = max(1, kind.bit_width // BITS_PER_BYTE)
    except ValueError:  # another nested type (union, fixed-size list): every row may hold all of it
        width = array.get_total_buffer_size()
    return pc.if_else(array.is_valid(), width, 0).cast(pa.int64())


def _summed_per_list(array: pa.ListArray | pa.LargeListArray) -> pa.Array:
    """Each list's items' sizes summed: a running total over the items, read at the lists' bounds."""
    offsets = pc.cast(array.offsets, pa.int64())
    item_sizes = _cell_sizes(array.values)
    running = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(item_sizes)])
    ends = pc.take(running, pc.cast(offsets.slice(1), pa.int64()))
    starts = pc.take(running, pc.cast(offsets.slice(0, len(offsets) - 1), pa.int64()))
    return pc.if_else(array.is_valid(), pc.subtract(ends, starts), 0)
