"""A record type's Arrow schema, derived from its msgspec fields: the output's columns are declared once, in
core/records.py, and a field added there reaches every Parquet part (pyarrow's `from_pylist` drops a
key its schema lacks without a word, so a schema written by hand loses a new field silently).

Field order and names are the record's (its encode names); a field that may be None is nullable, as every
Arrow field is; a str enum is a string; an int is int64 unless its declared bounds fit int32 (token ids).
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec
import msgspec.inspect as mi
import pyarrow as pa

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


class NoArrowType(TypeError):
    """A record field of a type the output has no column type for: a programming error, caught by tests."""


def arrow_schema(record: type[msgspec.Struct], *, leave_out: Collection[str] = ()) -> pa.Schema:
    """The Arrow schema of a record type, one column per field, in the record's order (but the fields
    `leave_out` names: a field of its own schema, like the kept columns of a run)."""
    info = mi.type_info(record)
    if not isinstance(info, mi.StructType):
        raise NoArrowType(f"{record.__name__} is not a record")
    return pa.schema(
        [(field.encode_name, arrow_type(field.type)) for field in info.fields if field.name not in leave_out]
    )


def arrow_type(info: mi.Type) -> pa.DataType:
    """The Arrow type of one msgspec type."""
    if isinstance(info, mi.StrType):
        return pa.string()
    if isinstance(info, mi.EnumType) and all(isinstance(member.value, str) for member in info.cls):
        return pa.string()
    if isinstance(info, mi.BoolType):
        return pa.bool_()
    if isinstance(info, mi.IntType):
        return pa.int32() if _fits_int32(info) else pa.int64()
    if isinstance(info, mi.FloatType):
        return pa.float64()
    if isinstance(info, mi.ListType):
        return pa.list_(arrow_type(info.item_type))
    if isinstance(info, mi.StructType):
        return pa.struct([(field.encode_name, arrow_type(field.type)) for field in info.fields])
    if isinstance(info, mi.UnionType):
        present = [member for member in info.types if not isinstance(member, mi.NoneType)]
        if len(present) == 1:
            return arrow_type(present[0])  # T | None: a nullable column of T
    raise NoArrowType(f"no column type for {_describe(info)}")


def _fits_int32(info: mi.IntType) -> bool:
    low = info.ge if info.ge is not None else (info.gt + 1 if info.gt is not None else None)
    high = info.le if info.le is not None else (info.lt - 1 if info.lt is not None else None)
    return low is not None and high is not None and low >= INT32_MIN and high <= INT32_MAX


def _describe(info: mi.Type) -> str:
    if isinstance(info, mi.EnumType):
        return f"the enum {info.cls.__name__} (only str enums are columns)"
    return type(info).__name__
