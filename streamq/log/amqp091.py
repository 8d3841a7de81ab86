"""AMQP 0-9-1 basic properties with their field-table types kept: the conversion's side.

The log stores a message's basic properties in wire form (a 16-bit flag word, then the
present fields in flag order, spec 4.2.6.1). Converting them to AMQP 1.0 needs each header
value's wire tag (an int32 `I` becomes an AMQP 1.0 `int`, a uint8 `B` a `ubyte`), which the
gateway's codec folds into Python marker classes and which `amqp_gateway` may not be imported
from here (streamq.log is below it). So this module is a small tagged codec of its own:

- `decode_properties(raw)` -> {name: value} for the present properties; `headers` is a
  list of `(name, tag, value)` in table order, an array value a list of `(tag, value)`.
  Values by tag: `S` str (UTF-8, surrogateescape), `x` bytes, `t` bool, `D` a
  `(scale, unscaled)` pair, `F` a nested list of `(name, tag, value)`, `V` None, numbers int
  or float. `L` is read as `l` (int64), as RabbitMQ does.
- `encode_properties(values)` is its inverse: decode -> encode is byte-exact.

Rules:
1. Pure functions, no I/O. A malformed property list raises `PropertiesMalformed`; a value
   the wire cannot carry raises it too when encoding.
"""

from __future__ import annotations

import struct
from typing import Any, Final, TypeAlias

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

TABLE_DEPTH_MAX: Final = 64  # as the gateway's codec: a hostile table cannot exhaust the stack
SHORTSTR_BYTES_MAX: Final = 255

Tagged: TypeAlias = tuple[str, Any]
"""A field value with its wire tag, e.g. ("I", 5) or ("S", "text")."""
Header: TypeAlias = tuple[str, str, Any]
"""A field-table entry: (name, tag, value)."""
Fields: TypeAlias = dict[str, Any]
"""Properties by name, as `decode_properties` returns them."""

_FLAGS: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_DECIMAL: Final = struct.Struct(">BI")
_SCALARS: Final[dict[str, struct.Struct]] = {
    "b": struct.Struct(">b"),
    "B": struct.Struct(">B"),
    "s": struct.Struct(">h"),
    "u": struct.Struct(">H"),
    "I": struct.Struct(">i"),
    "i": struct.Struct(">I"),
    "l": struct.Struct(">q"),
    "f": struct.Struct(">f"),
    "d": struct.Struct(">d"),
    "T": struct.Struct(">Q"),
}
_OCTETS: Final = frozenset({"delivery_mode", "priority"})


class PropertiesMalformed(ValueError):
    """Bytes that are not a valid AMQP basic property list (or a value that cannot be one)."""


def decode_properties(raw: bytes) -> Fields:
    """The present properties by name (see the module docstring for the value shapes)."""
    values: Fields = {}
    try:
        (flags,) = _FLAGS.unpack_from(raw, 0)
        position = _FLAGS.size
        for bit, name in enumerate(PROPERTY_NAMES):
            if not flags & (1 << (15 - bit)):
                continue
            if name == "headers":
                values[name], position = _read_table(raw, position, 0)
            elif name in _OCTETS:
                values[name] = raw[position]
                position += 1
            elif name == "timestamp":
                values[name] = _U64.unpack_from(raw, position)[0]
                position += _U64.size
            else:
                values[name], position = _read_shortstr(raw, position)
    except (struct.error, IndexError) as exc:
        raise PropertiesMalformed(f"malformed content properties: {exc}") from exc
    if position != len(raw):
        raise PropertiesMalformed(f"{len(raw) - position} bytes after the content properties")
    return values


def encode_properties(values: Fields) -> bytes:
    """The wire form of `values` (names as `PROPERTY_NAMES`; absent or None: not set)."""
    out = bytearray(2)
    flags = 0
    try:
        for bit, name in enumerate(PROPERTY_NAMES):
            value = values.get(name)
            if value is None:
                continue
            flags |= 1 << (15 - bit)
            if name == "headers":
                _write_table(out, value, 0)
            elif name in _OCTETS:
                out.append(value)
            elif name == "timestamp":
                out += _U64.pack(value)
            else:
                _write_shortstr(out, value)
    except (struct.error, ValueError, TypeError, OverflowError) as exc:
        raise PropertiesMalformed(f"cannot encode content properties: {exc}") from exc
    _FLAGS.pack_into(out, 0, flags)
    return bytes(out)


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


def _read_table(raw: bytes, position: int, depth: int) -> tuple[list[Header], int]:
    if depth > TABLE_DEPTH_MAX:
        raise PropertiesMalformed(f"field tables nested deeper than {TABLE_DEPTH_MAX}")
    position, end = _read_sized(raw, position)
    table: list[Header] = []
    while position < end:
        name, position = _read_shortstr(raw, position)
        (tag, value), position = _read_value(raw, position, depth)
        table.append((name, tag, value))
    if position != end:
        raise PropertiesMalformed("field table entries overrun the table length")
    return table, end


def _read_array(raw: bytes, position: int, depth: int) -> tuple[list[Tagged], int]:
    if depth > TABLE_DEPTH_MAX:
        raise PropertiesMalformed(f"field arrays nested deeper than {TABLE_DEPTH_MAX}")
    position, end = _read_sized(raw, position)
    items: list[Tagged] = []
    while position < end:
        item, position = _read_value(raw, position, depth)
        items.append(item)
    if position != end:
        raise PropertiesMalformed("field array values overrun the array length")
    return items, end


def _read_value(raw: bytes, position: int, depth: int) -> tuple[Tagged, int]:
    tag = chr(raw[position])
    position += 1
    layout = _SCALARS.get("l" if tag == "L" else tag)
    if layout is not None:
        return ("l" if tag == "L" else tag, layout.unpack_from(raw, position)[0]), (
            position + layout.size
        )
    if tag == "t":
        return (tag, raw[position] != 0), position + 1
    if tag == "D":
        return (tag, _DECIMAL.unpack_from(raw, position)), position + _DECIMAL.size
    if tag in ("S", "x"):
        start, end = _read_sized(raw, position)
        data = raw[start:end]
        return (tag, data.decode("utf-8", "surrogateescape") if tag == "S" else data), end
    if tag == "V":
        return (tag, None), position
    if tag == "F":
        table, position = _read_table(raw, position, depth + 1)
        return (tag, table), position
    if tag == "A":
        array, position = _read_array(raw, position, depth + 1)
        return (tag, array), position
    raise PropertiesMalformed(f"unknown field value type 0x{ord(tag):02x}")


def _write_shortstr(out: bytearray, value: str) -> None:
    data = value.encode("utf-8", "surrogateescape")
    if len(data) > SHORTSTR_BYTES_MAX:
        raise ValueError(f"shortstr of {len(data)} bytes")
    out.append(len(data))
    out += data


def _write_sized(out: bytearray, data: bytes) -> None:
    out += _U32.pack(len(data))
    out += data


def _write_table(out: bytearray, table: list[Header], depth: int) -> None:
    if depth > TABLE_DEPTH_MAX:
        raise ValueError(f"field tables nested deeper than {TABLE_DEPTH_MAX}")
    body = bytearray()
    for name, tag, value in table:
        _write_shortstr(body, name)
        _write_value(body, tag, value, depth)
    _write_sized(out, bytes(body))


def _write_value(out: bytearray, tag: str, value: Any, depth: int) -> None:
    out += tag.encode("ascii")
    layout = _SCALARS.get(tag)
    if layout is not None:
        out += layout.pack(value)
    elif tag == "t":
        out.append(1 if value else 0)
    elif tag == "D":
        out += _DECIMAL.pack(*value)
    elif tag == "S":
        _write_sized(out, value.encode("utf-8", "surrogateescape"))
    elif tag == "x":
        _write_sized(out, bytes(value))
    elif tag == "F":
        _write_table(out, value, depth + 1)
    elif tag == "A":
        body = bytearray()
        for item_tag, item in value:
            _write_value(body, item_tag, item, depth + 1)
        _write_sized(out, bytes(body))
    elif tag != "V":
        raise ValueError(f"unknown field value type {tag!r}")
