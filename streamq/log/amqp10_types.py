"""The AMQP 1.0 type system (OASIS AMQP 1.0 part 1) as far as messages need it.

Values are kept with their AMQP type, as `(kind, value)` pairs, so that a conversion can
map each type to its AMQP 0-9-1 counterpart:

    kind        value                     constructors decoded (encoded: the smallest)
    null        None                      0x40
    bool        bool                      0x41 0x42 0x56
    ubyte ushort uint ulong               0x50 0x60 0x70 0x52 0x43 0x80 0x53 0x44
    byte short int long                   0x51 0x61 0x71 0x54 0x81 0x55
    float double                          0x72 0x82
    decimal32/64/128  bytes (raw)         0x74 0x84 0x94
    char        str (one code point)      0x73
    timestamp   int (ms since the epoch)  0x83
    uuid        bytes (16)                0x98
    binary      bytes                     0xa0 0xb0
    string      str                       0xa1 0xb1
    symbol      str                       0xa3 0xb3
    list        list[Value]               0x45 0xc0 0xd0
    map         list[(Value, Value)]      0xc1 0xd1
    array       list[Value]               0xe0 0xf0 (elements share one constructor)
    described   (descriptor, Value)       0x00

A message is a run of described sections (part 3.2); `decode_sections` splits one.

Rules:
1. Pure functions over buffers. Malformed input raises `Amqp10Malformed` (a ValueError),
   never IndexError or a hang: every read is bounded by the enclosing compound's end,
   nesting by `DEPTH_MAX`, and an element count by the compound's byte size.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final, TypeAlias

Value: TypeAlias = tuple[str, Any]  # (kind, value): the value's type follows the kind

DEPTH_MAX: Final = 64

SECTION_HEADER: Final = 0x70
SECTION_DELIVERY_ANNOTATIONS: Final = 0x71
SECTION_MESSAGE_ANNOTATIONS: Final = 0x72
SECTION_PROPERTIES: Final = 0x73
SECTION_APPLICATION_PROPERTIES: Final = 0x74
SECTION_DATA: Final = 0x75
SECTION_AMQP_SEQUENCE: Final = 0x76
SECTION_AMQP_VALUE: Final = 0x77
SECTION_FOOTER: Final = 0x78
_SECTION_NAMES: Final = {
    "amqp:header:list": SECTION_HEADER,
    "amqp:delivery-annotations:map": SECTION_DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": SECTION_MESSAGE_ANNOTATIONS,
    "amqp:properties:list": SECTION_PROPERTIES,
    "amqp:application-properties:map": SECTION_APPLICATION_PROPERTIES,
    "amqp:data:binary": SECTION_DATA,
    "amqp:amqp-sequence:list": SECTION_AMQP_SEQUENCE,
    "amqp:amqp-value:*": SECTION_AMQP_VALUE,
    "amqp:footer:map": SECTION_FOOTER,
}

NULL: Final[Value] = ("null", None)


class Amqp10Malformed(ValueError):
    """Bytes that are not a well-formed AMQP 1.0 value or message."""


# constructor -> (kind, struct) for fixed-width values
_FIXED: Final[dict[int, tuple[str, struct.Struct]]] = {
    0x50: ("ubyte", struct.Struct(">B")),
    0x60: ("ushort", struct.Struct(">H")),
    0x70: ("uint", struct.Struct(">I")),
    0x52: ("uint", struct.Struct(">B")),
    0x80: ("ulong", struct.Struct(">Q")),
    0x53: ("ulong", struct.Struct(">B")),
    0x51: ("byte", struct.Struct(">b")),
    0x61: ("short", struct.Struct(">h")),
    0x71: ("int", struct.Struct(">i")),
    0x54: ("int", struct.Struct(">b")),
    0x81: ("long", struct.Struct(">q")),
    0x55: ("long", struct.Struct(">b")),
    0x72: ("float", struct.Struct(">f")),
    0x82: ("double", struct.Struct(">d")),
    0x83: ("timestamp", struct.Struct(">q")),
    0x56: ("bool", struct.Struct(">?")),
}
_CONSTANTS: Final[dict[int, Value]] = {
    0x40: NULL,
    0x41: ("bool", True),
    0x42: ("bool", False),
    0x43: ("uint", 0),
    0x44: ("ulong", 0),
    0x45: ("list", []),
}
_OPAQUE: Final = {0x74: ("decimal32", 4), 0x84: ("decimal64", 8), 0x94: ("decimal128", 16)}
_VARIABLE: Final = {
    0xA0: ("binary", 1),
    0xB0: ("binary", 4),
    0xA1: ("string", 1),
    0xB1: ("string", 4),
    0xA3: ("symbol", 1),
    0xB3: ("symbol", 4),
}
_COMPOUND: Final = {0xC0: ("list", 1), 0xD0: ("list", 4), 0xC1: ("map", 1), 0xD1: ("map", 4)}
_ARRAY: Final = {0xE0: 1, 0xF0: 4}
_U8: Final = struct.Struct(">B")
_U32: Final = struct.Struct(">I")


def _length(buf: bytes, pos: int, end: int, width: int) -> tuple[int, int]:
    if pos + width > end:
        raise Amqp10Malformed("truncated AMQP 1.0 value")
    n = buf[pos] if width == 1 else _U32.unpack_from(buf, pos)[0]
    return n, pos + width


def decode_value(buf: bytes, pos: int, end: int, depth: int = 0) -> tuple[Value, int]:
    """The value whose constructor is at `pos`, and the position after it."""
    if pos >= end:
        raise Amqp10Malformed("truncated AMQP 1.0 value")
    code = buf[pos]
    if code == 0x00:
        if depth >= DEPTH_MAX:
            raise Amqp10Malformed(f"AMQP 1.0 values nested deeper than {DEPTH_MAX}")
        descriptor, pos = decode_value(buf, pos + 1, end, depth + 1)
        value, pos = decode_value(buf, pos, end, depth + 1)
        return ("described", (descriptor, value)), pos
    return _decode_payload(code, buf, pos + 1, end, depth)


def _decode_payload(code: int, buf: bytes, pos: int, end: int, depth: int) -> tuple[Value, int]:
    constant = _CONSTANTS.get(code)
    if constant is not None:
        return (constant[0], list(constant[1]) if code == 0x45 else constant[1]), pos
    fixed = _FIXED.get(code)
    if fixed is not None:
        kind, layout = fixed
        if pos + layout.size > end:
            raise Amqp10Malformed(f"truncated AMQP 1.0 {kind}")
        return (kind, layout.unpack_from(buf, pos)[0]), pos + layout.size
    return _decode_sized(code, buf, pos, end, depth)


def _decode_sized(code: int, buf: bytes, pos: int, end: int, depth: int) -> tuple[Value, int]:
    variable = _VARIABLE.get(code)
    if variable is not None:
        kind, width = variable
        size, pos = _length(buf, pos, end, width)
        if pos + size > end:
            raise Amqp10Malformed(f"AMQP 1.0 {kind} runs past its end")
        data = bytes(buf[pos : pos + size])
        if kind == "binary":
            return (kind, data), pos + size
        return (kind, data.decode("utf-8", "surrogateescape")), pos + size
    if code in _OPAQUE or code in (0x73, 0x98):
        kind, size = _OPAQUE.get(code) or (("char", 4) if code == 0x73 else ("uuid", 16))
        if pos + size > end:
            raise Amqp10Malformed(f"truncated AMQP 1.0 {kind}")
        data = bytes(buf[pos : pos + size])
        if kind == "char":
            return (kind, _char(data)), pos + size
        return (kind, data), pos + size
    if depth >= DEPTH_MAX:
        raise Amqp10Malformed(f"AMQP 1.0 values nested deeper than {DEPTH_MAX}")
    if code in _COMPOUND:
        return _decode_compound(code, buf, pos, end, depth + 1)
    if code in _ARRAY:
        return _decode_array(_ARRAY[code], buf, pos, end, depth + 1)
    raise Amqp10Malformed(f"unknown AMQP 1.0 constructor 0x{code:02x}")


def _char(data: bytes) -> str:
    try:
        return data.decode("utf-32-be")
    except UnicodeDecodeError as exc:
        raise Amqp10Malformed("AMQP 1.0 char is not a code point") from exc


def _region(buf: bytes, pos: int, end: int, width: int) -> tuple[int, int, int]:
    """(count, first element position, region end) of a list, map or array."""
    size, pos = _length(buf, pos, end, width)
    region_end = pos + size
    if region_end > end or size < width:
        raise Amqp10Malformed("AMQP 1.0 compound runs past its end")
    count, pos = _length(buf, pos, region_end, width)
    if count > size:  # zero-width elements (nulls) could otherwise claim billions
        raise Amqp10Malformed("AMQP 1.0 compound claims more elements than bytes")
    return count, pos, region_end


def _decode_compound(code: int, buf: bytes, pos: int, end: int, depth: int) -> tuple[Value, int]:
    kind, width = _COMPOUND[code]
    count, pos, region_end = _region(buf, pos, end, width)
    items: list[Value] = []
    for _ in range(count):
        item, pos = decode_value(buf, pos, region_end, depth)
        items.append(item)
    if pos != region_end:
        raise Amqp10Malformed(f"AMQP 1.0 {kind} size does not match its elements")
    if kind == "list":
        return ("list", items), pos
    if count % 2:
        raise Amqp10Malformed("AMQP 1.0 map with an odd number of elements")
    return ("map", list(zip(items[::2], items[1::2], strict=True))), pos


def _decode_array(width: int, buf: bytes, pos: int, end: int, depth: int) -> tuple[Value, int]:
    count, pos, region_end = _region(buf, pos, end, width)
    if count == 0:
        return ("array", []), region_end
    descriptor: Value | None = None
    if pos < region_end and buf[pos] == 0x00:
        descriptor, pos = decode_value(buf, pos + 1, region_end, depth)
    if pos >= region_end:
        raise Amqp10Malformed("AMQP 1.0 array without an element constructor")
    code = buf[pos]
    pos += 1
    items: list[Value] = []
    for _ in range(count):
        item, pos = _decode_payload(code, buf, pos, region_end, depth)
        items.append(item if descriptor is None else ("described", (descriptor, item)))
    if pos != region_end:
        raise Amqp10Malformed("AMQP 1.0 array size does not match its elements")
    return ("array", items), pos


def section_code(descriptor: Value) -> int | None:
    """The section number of a described section's descriptor (ulong or symbol)."""
    kind, value = descriptor
    if kind == "ulong":
        return int(value)
    if kind == "symbol":
        return _SECTION_NAMES.get(value)
    return None


def decode_sections(data: bytes) -> list[tuple[int, Value, int, int]]:
    """A message's sections: (section number, value, start, end) each, in order.

    Raises Amqp10Malformed unless `data` is a run of described values with section
    descriptors (0x70..0x78) and nothing else."""
    sections: list[tuple[int, Value, int, int]] = []
    pos, end = 0, len(data)
    while pos < end:
        if data[pos] != 0x00:
            raise Amqp10Malformed("an AMQP 1.0 message section is not a described value")
        start = pos
        descriptor, pos = decode_value(data, pos + 1, end, 1)
        code = section_code(descriptor)
        if code is None or not SECTION_HEADER <= code <= SECTION_FOOTER:
            raise Amqp10Malformed(f"unknown AMQP 1.0 message section {descriptor[1]!r}")
        value, pos = decode_value(data, pos, end, 1)
        sections.append((code, value, start, pos))
    return sections


# --- encoding -----------------------------------------------------------------------------


def encode_section(out: bytearray, code: int, value: Value) -> None:
    """Append a described section with the small ulong descriptor `code`."""
    out += b"\x00\x53"
    out.append(code)
    encode_value(out, value)


def _encode_uint(out: bytearray, value: int, zero: int, small: int, large: int, fmt: str) -> None:
    if value == 0:
        out.append(zero)
    elif value < 256:
        out += bytes((small, value))
    else:
        out.append(large)
        out += struct.pack(fmt, value)


def _encode_int(out: bytearray, value: int, small: int, large: int, fmt: str) -> None:
    if -128 <= value < 128:
        out += bytes((small,)) + struct.pack(">b", value)
    else:
        out.append(large)
        out += struct.pack(fmt, value)


def _encode_sized(out: bytearray, data: bytes, small: int, large: int) -> None:
    if len(data) < 256:
        out += bytes((small, len(data)))
    else:
        out.append(large)
        out += _U32.pack(len(data))
    out += data


def _encode_compound(out: bytearray, count: int, body: bytes, small: int, large: int) -> None:
    if len(body) + 1 < 256 and count < 256:
        out += bytes((small, len(body) + 1, count))
    else:
        out.append(large)
        out += _U32.pack(len(body) + 4) + _U32.pack(count)
    out += body


def _encode_list(out: bytearray, items: list[Value]) -> None:
    if not items:
        out.append(0x45)
        return
    body = bytearray()
    for item in items:
        encode_value(body, item)
    _encode_compound(out, len(items), bytes(body), 0xC0, 0xD0)


def _encode_map(out: bytearray, pairs: list[tuple[Value, Value]]) -> None:
    body = bytearray()
    for key, item in pairs:
        encode_value(body, key)
        encode_value(body, item)
    _encode_compound(out, 2 * len(pairs), bytes(body), 0xC1, 0xD1)


def _utf8(value: object) -> bytes:
    return str(value).encode("utf-8", "surrogateescape")


def _encode_described(out: bytearray, value: tuple[Value, Value]) -> None:
    out.append(0x00)
    encode_value(out, value[0])
    encode_value(out, value[1])


_ENCODERS: Final[dict[str, Callable[[bytearray, Any], None]]] = {
    "null": lambda out, _v: out.append(0x40),
    "bool": lambda out, v: out.append(0x41 if v else 0x42),
    "ubyte": lambda out, v: out.extend(struct.pack(">BB", 0x50, v)),
    "ushort": lambda out, v: out.extend(struct.pack(">BH", 0x60, v)),
    "uint": lambda out, v: _encode_uint(out, v, 0x43, 0x52, 0x70, ">I"),
    "ulong": lambda out, v: _encode_uint(out, v, 0x44, 0x53, 0x80, ">Q"),
    "byte": lambda out, v: out.extend(struct.pack(">Bb", 0x51, v)),
    "short": lambda out, v: out.extend(struct.pack(">Bh", 0x61, v)),
    "int": lambda out, v: _encode_int(out, v, 0x54, 0x71, ">i"),
    "long": lambda out, v: _encode_int(out, v, 0x55, 0x81, ">q"),
    "float": lambda out, v: out.extend(struct.pack(">Bf", 0x72, v)),
    "double": lambda out, v: out.extend(struct.pack(">Bd", 0x82, v)),
    "timestamp": lambda out, v: out.extend(struct.pack(">Bq", 0x83, v)),
    "char": lambda out, v: out.extend(b"\x73" + v.encode("utf-32-be")),
    "uuid": lambda out, v: out.extend(b"\x98" + bytes(v)),
    "decimal32": lambda out, v: out.extend(b"\x74" + bytes(v)),
    "decimal64": lambda out, v: out.extend(b"\x84" + bytes(v)),
    "decimal128": lambda out, v: out.extend(b"\x94" + bytes(v)),
    "binary": lambda out, v: _encode_sized(out, bytes(v), 0xA0, 0xB0),
    "string": lambda out, v: _encode_sized(out, _utf8(v), 0xA1, 0xB1),
    "symbol": lambda out, v: _encode_sized(out, _utf8(v), 0xA3, 0xB3),
    "list": _encode_list,
    "map": _encode_map,
    "array": _encode_list,
    "described": _encode_described,
}


def encode_value(out: bytearray, value: Value) -> None:
    """Append `value` in its smallest encoding. An `array` is written as a list (every
    reader accepts a list where the conversion produces one). Raises Amqp10Malformed for a
    value its kind cannot carry."""
    try:
        _ENCODERS[value[0]](out, value[1])
    except (KeyError, struct.error, TypeError, ValueError, UnicodeEncodeError) as exc:
        raise Amqp10Malformed(f"cannot encode {value[0]} {value[1]!r}: {exc}") from exc
