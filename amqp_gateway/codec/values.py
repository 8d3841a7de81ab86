"""AMQP 0-9-1 value encodings: strings, field tables and field arrays.

This module owns the byte layout of shortstr, longstr and the field-value types that
RabbitMQ speaks inside tables and arrays (spec 4.2.5.5 as amended by RabbitMQ's errata,
https://www.rabbitmq.com/amqp-0-9-1-errata.html#section_3):

    tag  type              Python type on decode     encoded from
    t    boolean           bool                      bool
    b    int8              Int8                      Int8
    B    uint8             UInt8                     UInt8
    s    int16             Int16                     Int16
    u    uint16            UInt16                    UInt16
    I    int32             int                       int in int32 range
    i    uint32            UInt32                    UInt32
    l    int64             Int64                     Int64, or int beyond int32
    f    float32           Float32                   Float32
    d    float64           float                     float
    D    decimal           decimal.Decimal           Decimal (scale octet, uint32)
    S    longstr           str                       str
    A    array             list                      list or tuple
    T    timestamp         Timestamp                 Timestamp (seconds, uint64)
    F    table             dict                      dict (any Mapping)
    V    void              None                      None
    x    byte array        bytes                     bytes, bytearray, memoryview

The marker classes (`Int8`, `Timestamp`, `Float32`, ...) subclass `int` or `float`, so a
decoded table behaves like plain numbers while re-encoding to the very same tags: a
decode -> encode round trip is byte-exact. `L` (which RabbitMQ also reads as int64) is
accepted on decode and re-encoded as `l`.

Strings inside tables (field names and `S` values) are peer data, not identifiers: they
decode as UTF-8 with `surrogateescape`, so any bytes survive a round trip unchanged.

Rules:
1. Pure functions over buffers; no I/O and no state. The `read_*` functions are the raw
   readers for sibling codec modules: they may raise `struct.error`, `IndexError`,
   `UnicodeDecodeError` or `AMQPSyntaxError`, and the public `decode_*` functions turn all
   of them into `AMQPSyntaxError` (502).
2. Encoders raise `ValueError` for values the wire cannot carry (a programmer error).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Final, TypeAlias

from amqp_gateway.errors import AMQPSyntaxError

SHORTSTR_BYTES_MAX: Final = 255
TABLE_DEPTH_MAX: Final = 64
"""Nesting limit for tables and arrays, so a hostile frame cannot exhaust the stack."""


class _TaggedInt(int):
    """An int that remembers which integer tag carries it in a field table."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"


class Int8(_TaggedInt):
    """A table value carried with tag `b`."""

    __slots__ = ()


class UInt8(_TaggedInt):
    """A table value carried with tag `B`."""

    __slots__ = ()


class Int16(_TaggedInt):
    """A table value carried with tag `s` (signed, as RabbitMQ reads it)."""

    __slots__ = ()


class UInt16(_TaggedInt):
    """A table value carried with tag `u`."""

    __slots__ = ()


class UInt32(_TaggedInt):
    """A table value carried with tag `i`."""

    __slots__ = ()


class Int64(_TaggedInt):
    """A table value carried with tag `l` (plain ints beyond int32 also use `l`)."""

    __slots__ = ()


class Timestamp(_TaggedInt):
    """A table value carried with tag `T`: seconds since the Unix epoch, uint64."""

    __slots__ = ()


class Float32(float):
    """A table value carried with tag `f` (plain floats use `d`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Float32({float(self)!r})"


FieldValue: TypeAlias = (
    bool | int | float | Decimal | str | bytes | list["FieldValue"] | dict[str, "FieldValue"] | None
)
FieldTable: TypeAlias = dict[str, FieldValue]
FieldArray: TypeAlias = list[FieldValue]

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_DECIMAL = struct.Struct(">BI")
_SCALARS: Final[dict[int, tuple[struct.Struct, type]]] = {
    ord("b"): (struct.Struct(">b"), Int8),
    ord("B"): (struct.Struct(">B"), UInt8),
    ord("s"): (struct.Struct(">h"), Int16),
    ord("u"): (struct.Struct(">H"), UInt16),
    ord("I"): (struct.Struct(">i"), int),
    ord("i"): (struct.Struct(">I"), UInt32),
    ord("l"): (struct.Struct(">q"), Int64),
    ord("L"): (struct.Struct(">q"), Int64),
    ord("f"): (struct.Struct(">f"), Float32),
    ord("d"): (struct.Struct(">d"), float),
    ord("T"): (struct.Struct(">Q"), Timestamp),
}
_TAG_BY_TYPE: Final[dict[type, bytes]] = {
    Int8: b"b",
    UInt8: b"B",
    Int16: b"s",
    UInt16: b"u",
    UInt32: b"i",
    Int64: b"l",
    Timestamp: b"T",
    Float32: b"f",
    float: b"d",
}
_STRUCT_BY_TAG: Final[dict[bytes, struct.Struct]] = {
    tag: _SCALARS[tag[0]][0] for tag in _TAG_BY_TYPE.values()
}
_INT32_MIN: Final = -(1 << 31)
_INT32_MAX: Final = (1 << 31) - 1


# Raw readers: (buffer, offset) -> (value, next offset). Errors are converted by callers.


def read_shortstr(buf: bytes, offset: int) -> tuple[str, int]:
    """Read a shortstr that must be valid UTF-8 (names and identifiers)."""
    end = offset + 1 + buf[offset]
    if end > len(buf):
        raise AMQPSyntaxError("shortstr runs past the end of its frame")
    return buf[offset + 1 : end].decode(), end


def read_shortstr_lenient(buf: bytes, offset: int) -> tuple[str, int]:
    """Read a shortstr of peer data: invalid UTF-8 is kept via `surrogateescape`."""
    end = offset + 1 + buf[offset]
    if end > len(buf):
        raise AMQPSyntaxError("shortstr runs past the end of its frame")
    return buf[offset + 1 : end].decode("utf-8", "surrogateescape"), end


def read_longstr(buf: bytes, offset: int) -> tuple[bytes, int]:
    start = offset + 4
    end = start + _U32.unpack_from(buf, offset)[0]
    if end > len(buf):
        raise AMQPSyntaxError("longstr runs past the end of its frame")
    return buf[start:end], end


def read_table(buf: bytes, offset: int, depth: int = 0) -> tuple[FieldTable, int]:
    """Read a length-prefixed field table whose entries exactly fill its length."""
    if depth > TABLE_DEPTH_MAX:
        raise AMQPSyntaxError(f"field tables nested deeper than {TABLE_DEPTH_MAX}")
    end = offset + 4 + _U32.unpack_from(buf, offset)[0]
    if end > len(buf):
        raise AMQPSyntaxError("field table length runs past the end of its frame")
    table: FieldTable = {}
    offset += 4
    while offset < end:
        name, offset = read_shortstr_lenient(buf, offset)
        table[name], offset = _read_value(buf, offset, depth)
    if offset != end:
        raise AMQPSyntaxError("field table entries overrun the table length")
    return table, end


def read_array(buf: bytes, offset: int, depth: int = 0) -> tuple[FieldArray, int]:
    if depth > TABLE_DEPTH_MAX:
        raise AMQPSyntaxError(f"field arrays nested deeper than {TABLE_DEPTH_MAX}")
    end = offset + 4 + _U32.unpack_from(buf, offset)[0]
    if end > len(buf):
        raise AMQPSyntaxError("field array length runs past the end of its frame")
    array: FieldArray = []
    offset += 4
    while offset < end:
        value, offset = _read_value(buf, offset, depth)
        array.append(value)
    if offset != end:
        raise AMQPSyntaxError("field array values overrun the array length")
    return array, end


def _read_value(buf: bytes, offset: int, depth: int) -> tuple[FieldValue, int]:
    tag = buf[offset]
    offset += 1
    scalar = _SCALARS.get(tag)
    if scalar is not None:
        layout, python_type = scalar
        value = python_type(layout.unpack_from(buf, offset)[0])
        return value, offset + layout.size
    reader = _READERS.get(tag)
    if reader is None:
        raise AMQPSyntaxError(f"unknown field value type {chr(tag)!r} (0x{tag:02x})")
    return reader(buf, offset, depth)


def _read_bool(buf: bytes, offset: int, depth: int) -> tuple[FieldValue, int]:
    return buf[offset] != 0, offset + 1


def _read_decimal(buf: bytes, offset: int, depth: int) -> tuple[FieldValue, int]:
    scale, unscaled = _DECIMAL.unpack_from(buf, offset)
    return Decimal(unscaled).scaleb(-scale), offset + _DECIMAL.size


def _read_longstr_value(buf: bytes, offset: int, depth: int) -> tuple[FieldValue, int]:
    raw, offset = read_longstr(buf, offset)
    return raw.decode("utf-8", "surrogateescape"), offset


def _read_bytes_value(buf: bytes, offset: int, depth: int) -> tuple[FieldValue, int]:
    return read_longstr(buf, offset)


def _read_void(buf: bytes, offset: int, depth: int) -> tuple[FieldValue, int]:
    return None, offset


def _read_table_value(buf: bytes, offset: int, depth: int) -> tuple[FieldValue, int]:
    return read_table(buf, offset, depth + 1)


def _read_array_value(buf: bytes, offset: int, depth: int) -> tuple[FieldValue, int]:
    return read_array(buf, offset, depth + 1)


_READERS: Final[dict[int, Callable[[bytes, int, int], tuple[FieldValue, int]]]] = {
    ord("t"): _read_bool,
    ord("D"): _read_decimal,
    ord("S"): _read_longstr_value,
    ord("x"): _read_bytes_value,
    ord("V"): _read_void,
    ord("F"): _read_table_value,
    ord("A"): _read_array_value,
}


def decode_table(data: bytes) -> FieldTable:
    """Decode a length-prefixed field table that fills `data` exactly.

    Raises `AMQPSyntaxError` (502) for any malformed input.
    """
    try:
        table, end = read_table(data, 0)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise AMQPSyntaxError(f"malformed field table: {exc}") from exc
    if end != len(data):
        raise AMQPSyntaxError("bytes after the end of the field table")
    return table


# Writers: append to a bytearray. Values the wire cannot carry raise ValueError.


def write_shortstr(out: bytearray, value: str) -> None:
    raw = value.encode("utf-8", "surrogateescape")
    if len(raw) > SHORTSTR_BYTES_MAX:
        raise ValueError(f"shortstr of {len(raw)} bytes exceeds {SHORTSTR_BYTES_MAX}")
    out.append(len(raw))
    out += raw


def write_longstr(out: bytearray, value: bytes | bytearray | memoryview) -> None:
    out += _U32.pack(len(value))
    out += value


def write_table(out: bytearray, table: Mapping[str, FieldValue]) -> None:
    """Append a length-prefixed field table."""
    start = len(out)
    out += b"\x00\x00\x00\x00"
    for name, value in table.items():
        write_shortstr(out, name)
        write_value(out, value)
    _U32.pack_into(out, start, len(out) - start - 4)


def write_array(out: bytearray, array: list[FieldValue] | tuple[FieldValue, ...]) -> None:
    start = len(out)
    out += b"\x00\x00\x00\x00"
    for value in array:
        write_value(out, value)
    _U32.pack_into(out, start, len(out) - start - 4)


def write_value(out: bytearray, value: object) -> None:
    """Append one tagged field value, choosing the tag from the Python type (see above).

    Takes `object` because it is the runtime check for values typed only loosely by
    callers (a `FieldValue` is what it accepts).
    """
    tag = _TAG_BY_TYPE.get(type(value))
    try:
        if tag is not None:
            out += tag
            out += _STRUCT_BY_TAG[tag].pack(value)
        elif value is None:
            out += b"V"
        elif isinstance(value, bool):
            out += b"t\x01" if value else b"t\x00"
        elif isinstance(value, int):
            _write_int(out, value)
        elif isinstance(value, str):
            out += b"S"
            write_longstr(out, value.encode("utf-8", "surrogateescape"))
        elif isinstance(value, bytes | bytearray | memoryview):
            out += b"x"
            write_longstr(out, value)
        elif isinstance(value, Mapping):
            out += b"F"
            write_table(out, value)
        elif isinstance(value, list | tuple):
            out += b"A"
            write_array(out, value)
        elif isinstance(value, Decimal):
            out += b"D"
            out += _encode_decimal(value)
        else:
            raise ValueError(f"cannot encode {type(value).__name__} in a field table")
    except (struct.error, OverflowError, UnicodeEncodeError) as exc:
        raise ValueError(f"cannot encode {value!r} in a field table: {exc}") from exc


def _write_int(out: bytearray, value: int) -> None:
    if _INT32_MIN <= value <= _INT32_MAX:
        out += b"I"
        out += _SCALARS[ord("I")][0].pack(value)
    else:
        out += b"l"
        out += _SCALARS[ord("l")][0].pack(value)


def _encode_decimal(value: Decimal) -> bytes:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"cannot encode decimal {value}: not finite")
    unscaled = int("".join(map(str, digits)) or "0")
    if sign:
        unscaled = -unscaled
    scale = -exponent
    if scale < 0:
        unscaled *= 10**exponent
        scale = 0
    return _DECIMAL.pack(scale, unscaled)


def encode_table(table: Mapping[str, FieldValue]) -> bytes:
    """Encode a field table with its 4-byte length prefix.

    Raises `ValueError` for a value, name or string the wire cannot carry.
    """
    out = bytearray()
    write_table(out, table)
    return bytes(out)


def encode_array(array: list[FieldValue] | tuple[FieldValue, ...]) -> bytes:
    """Encode a field array with its 4-byte length prefix. Raises `ValueError` as above."""
    out = bytearray()
    write_array(out, array)
    return bytes(out)


def decode_array(data: bytes) -> FieldArray:
    """Decode a length-prefixed field array that fills `data` exactly.

    Raises `AMQPSyntaxError` (502) for any malformed input.
    """
    try:
        array, end = read_array(data, 0)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise AMQPSyntaxError(f"malformed field array: {exc}") from exc
    if end != len(data):
        raise AMQPSyntaxError("bytes after the end of the field array")
    return array
