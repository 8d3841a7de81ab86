"""AMQP 0-9-1 basic properties, as the log stores them, decoded into column values.

Owns the mapping from a record's `properties` bytes (the wire form: a 16-bit big-endian
flag word, then the present fields in flag order, spec 4.2.6.1) to the `properties` struct
and the `headers` list of the Spark schema. `amqp_gateway` has the broker's codec, but
spark_source may not import it (an executor must not need the broker), so the small read
side is reimplemented here; the unit tests cross-check it against that codec.

Header values become bytes, as Kafka's headers are: byte arrays (`x`) stay as they are,
strings (`S`) are their UTF-8, booleans `true`/`false`, numbers and decimals their decimal
text, void is null, and nested tables and arrays are JSON of the same conversion.

Rules:
1. Pure functions, no I/O. A malformed property list raises `PropertiesMalformed`.
"""

from __future__ import annotations

import json
import struct
from decimal import Decimal
from typing import Final

PROPERTY_NAMES: Final = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)
"""The 14 basic properties in wire order: the first has flag bit 15."""

TABLE_DEPTH_MAX: Final = 64  # as the broker's codec: a hostile table cannot exhaust the stack

_FLAGS: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_DECIMAL: Final = struct.Struct(">BI")
_OCTETS: Final = frozenset({"delivery_mode", "priority"})
_SCALARS: Final[dict[int, struct.Struct]] = {
    ord("b"): struct.Struct(">b"),
    ord("B"): struct.Struct(">B"),
    ord("s"): struct.Struct(">h"),
    ord("u"): struct.Struct(">H"),
    ord("I"): struct.Struct(">i"),
    ord("i"): struct.Struct(">I"),
    ord("l"): struct.Struct(">q"),
    ord("L"): struct.Struct(">q"),
    ord("f"): struct.Struct(">f"),
    ord("d"): struct.Struct(">d"),
    ord("T"): struct.Struct(">Q"),
}

Value = bool | int | float | Decimal | str | bytes | list["Value"] | dict[str, "Value"] | None
PropertyValue = str | int | list[tuple[str, bytes | None]] | None


class PropertiesMalformed(ValueError):
    """A record's properties are not a valid AMQP basic property list."""


def decode_properties(raw: bytes) -> dict[str, PropertyValue]:
    """The present properties by name; `headers` as (key, value bytes) pairs in table
    order and `timestamp` in seconds. Raises PropertiesMalformed."""
    values: dict[str, PropertyValue] = {}
    try:
        (flags,) = _FLAGS.unpack_from(raw, 0)
        position = _FLAGS.size
        for bit, name in enumerate(PROPERTY_NAMES):
            if not flags & (1 << (15 - bit)):
                continue
            if name == "headers":
                table, position = _read_table(raw, position, 0)
                values[name] = [(key, header_bytes(value)) for key, value in table.items()]
            elif name in _OCTETS:
                values[name] = raw[position]
                position += 1
            elif name == "timestamp":
                values[name] = int(_U64.unpack_from(raw, position)[0])
                position += _U64.size
            else:
                values[name], position = _read_shortstr(raw, position)
    except (struct.error, IndexError) as exc:
        raise PropertiesMalformed(f"malformed content properties: {exc}") from exc
    if position != len(raw):
        raise PropertiesMalformed(f"{len(raw) - position} bytes after the content properties")
    return values


def header_bytes(value: Value) -> bytes | None:
    """A header value as the `headers` column holds it (see the module docstring)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, int | float | Decimal):
        return str(value).encode()
    return json.dumps(_jsonable(value), separators=(",", ":")).encode()


def _jsonable(value: Value) -> object:
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    if isinstance(value, bytes | Decimal):
        raw = header_bytes(value)
        assert raw is not None
        return raw.decode("utf-8", "replace")
    return value


def _read_shortstr(raw: bytes, position: int) -> tuple[str, int]:
    end = position + 1 + raw[position]
    if end > len(raw):
        raise PropertiesMalformed("shortstr runs past the end of the properties")
    return raw[position + 1 : end].decode("utf-8", "surrogateescape"), end


def _read_sized(raw: bytes, position: int) -> tuple[int, int]:
    """(start, end) of a u32-length-prefixed region at `position`."""
    end = position + 4 + _U32.unpack_from(raw, position)[0]
    if end > len(raw):
        raise PropertiesMalformed("a table, array or longstr runs past the properties")
    return position + 4, end


def _read_table(raw: bytes, position: int, depth: int) -> tuple[dict[str, Value], int]:
    if depth > TABLE_DEPTH_MAX:
        raise PropertiesMalformed(f"field tables nested deeper than {TABLE_DEPTH_MAX}")
    position, end = _read_sized(raw, position)
    table: dict[str, Value] = {}
    while position < end:
        name, position = _read_shortstr(raw, position)
        table[name], position = _read_value(raw, position, depth)
    if position != end:
        raise PropertiesMalformed("field table entries overrun the table length")
    return table, end


def _read_array(raw: bytes, position: int, depth: int) -> tuple[list[Value], int]:
    if depth > TABLE_DEPTH_MAX:
        raise PropertiesMalformed(f"field arrays nested deeper than {TABLE_DEPTH_MAX}")
    position, end = _read_sized(raw, position)
    items: list[Value] = []
    while position < end:
        value, position = _read_value(raw, position, depth)
        items.append(value)
    if position != end:
        raise PropertiesMalformed("field array values overrun the array length")
    return items, end


def _read_value(raw: bytes, position: int, depth: int) -> tuple[Value, int]:
    tag = raw[position]
    position += 1
    layout = _SCALARS.get(tag)
    if layout is not None:
        number: int | float = layout.unpack_from(raw, position)[0]
        return number, position + layout.size
    if tag == ord("t"):
        return raw[position] != 0, position + 1
    if tag == ord("D"):
        scale, unscaled = _DECIMAL.unpack_from(raw, position)
        return Decimal(unscaled).scaleb(-scale), position + _DECIMAL.size
    if tag in (ord("S"), ord("x")):
        start, end = _read_sized(raw, position)
        data = raw[start:end]
        return (data.decode("utf-8", "surrogateescape") if tag == ord("S") else data), end
    if tag == ord("V"):
        return None, position
    if tag == ord("F"):
        return _read_table(raw, position, depth + 1)
    if tag == ord("A"):
        return _read_array(raw, position, depth + 1)
    raise PropertiesMalformed(f"unknown field value type 0x{tag:02x}")
