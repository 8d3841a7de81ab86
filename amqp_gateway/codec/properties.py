"""The basic class's content properties: a 16-bit flag word, then the present values.

This module owns `BasicProperties` and its wire form (spec 4.2.6.1): flag bit 15 marks
the first property of `spec.BASIC_PROPERTIES` (content-type), bit 2 the fourteenth
(cluster-id), and only the properties whose flag is set follow, in that order.

The broker keeps properties in this wire form (`properties_raw`, the bytes after
body-size in a content header) and decodes them only when it must look inside, e.g. at
`headers` for a headers exchange or `expiration` for a TTL.

Choices, following RabbitMQ (rabbit_framing_amqp_0_9_1:decode_properties/2):
- the two low flag bits are ignored: bit 0 would announce a further flag word, which the
  basic class, with 14 properties, never needs;
- string properties are peer data, decoded with `surrogateescape` so any bytes
  round-trip; bytes after the last present property are an error.

Rules:
1. Pure functions, no state. Decoding raises only `AMQPSyntaxError` (502); encoding
   raises `ValueError` for a value the wire cannot carry.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from amqp_gateway.codec.spec import BASIC_PROPERTIES, Kind
from amqp_gateway.codec.values import (
    FieldTable,
    read_shortstr_lenient,
    read_table,
    write_shortstr,
    write_table,
)
from amqp_gateway.errors import AMQPSyntaxError

_FLAGS = struct.Struct(">H")
_U64 = struct.Struct(">Q")

EMPTY_PROPERTIES_RAW: Final = b"\x00\x00"
"""The wire form of a property list with no property set."""


@dataclass(frozen=True, slots=True)
class BasicProperties:
    """The 14 basic properties; None means absent (its flag bit is clear)."""

    content_type: str | None = None
    content_encoding: str | None = None
    headers: FieldTable | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


# (attribute name, flag bit, kind) in wire order.
_LAYOUT: Final = tuple(
    (prop.name, 1 << (15 - index), prop.kind) for index, prop in enumerate(BASIC_PROPERTIES)
)


def _read_octet(buf: bytes, offset: int) -> tuple[int, int]:
    return buf[offset], offset + 1


def _read_timestamp(buf: bytes, offset: int) -> tuple[int, int]:
    return _U64.unpack_from(buf, offset)[0], offset + 8


_READERS: Final[dict[Kind, Callable[[bytes, int], tuple[Any, int]]]] = {
    Kind.SHORTSTR: read_shortstr_lenient,
    Kind.TABLE: read_table,
    Kind.OCTET: _read_octet,
    Kind.TIMESTAMP: _read_timestamp,
}


def decode_properties(raw: bytes) -> BasicProperties:
    """Decode a property list (flag word and values) that fills `raw` exactly.

    Raises `AMQPSyntaxError` (502) when it is truncated, has bytes left over or holds a
    malformed table.
    """
    values: dict[str, Any] = {}
    try:
        flags = _FLAGS.unpack_from(raw)[0]
        offset = _FLAGS.size
        for name, flag, kind in _LAYOUT:
            if flags & flag:
                values[name], offset = _READERS[kind](raw, offset)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise AMQPSyntaxError(f"malformed content properties: {exc}") from exc
    if offset != len(raw):
        raise AMQPSyntaxError(f"{len(raw) - offset} bytes after the content properties")
    return BasicProperties(**values)


def _write_octet(out: bytearray, value: int) -> None:
    out.append(value)


def _write_timestamp(out: bytearray, value: int) -> None:
    out += _U64.pack(value)


_WRITERS: Final[dict[Kind, Callable[[bytearray, Any], None]]] = {
    Kind.SHORTSTR: write_shortstr,
    Kind.TABLE: write_table,
    Kind.OCTET: _write_octet,
    Kind.TIMESTAMP: _write_timestamp,
}


def encode_properties(properties: BasicProperties) -> bytes:
    """The wire form of `properties`: flag word and present values (`properties_raw`).

    Raises `ValueError` when a value does not fit its wire type.
    """
    out = bytearray(EMPTY_PROPERTIES_RAW)
    flags = 0
    try:
        for name, flag, kind in _LAYOUT:
            value = getattr(properties, name)
            if value is not None:
                flags |= flag
                _WRITERS[kind](out, value)
    except (struct.error, OverflowError, TypeError) as exc:
        raise ValueError(f"cannot encode content properties: {exc}") from exc
    _FLAGS.pack_into(out, 0, flags)
    return bytes(out)


_CONTENT_TYPE_FLAG: Final = 0x8000
_CONTENT_ENCODING_FLAG: Final = 0x4000
_HEADERS_FLAG: Final = 0x2000
_TABLE_SIZE = struct.Struct(">I")
_LONG_ENTRY_TAIL = struct.Struct(">cq")  # tag 'l' and the int64


def add_long_header(properties_raw: bytes, name: str, value: int) -> bytes:
    """`properties_raw` with `name` (a header that is not there yet) set to the int64
    `value` in `headers`, by splicing bytes: a stream delivery's per-message path.

    Equivalent to decoding, adding the header and encoding (the tests check it);
    raises `AMQPSyntaxError` as `decode_properties` for a malformed property list.
    """
    try:
        (flags,) = _FLAGS.unpack_from(properties_raw, 0)
        position = 2
        for flag in (_CONTENT_TYPE_FLAG, _CONTENT_ENCODING_FLAG):
            if flags & flag:
                position += 1 + properties_raw[position]
        key = name.encode()
        entry = bytes((len(key),)) + key + _LONG_ENTRY_TAIL.pack(b"l", value)
        if flags & _HEADERS_FLAG:
            (size,) = _TABLE_SIZE.unpack_from(properties_raw, position)
            end = position + 4 + size
            if end > len(properties_raw):
                raise IndexError
            return b"".join(
                (
                    properties_raw[:position],
                    _TABLE_SIZE.pack(size + len(entry)),
                    properties_raw[position + 4 : end],
                    entry,
                    properties_raw[end:],
                )
            )
        return b"".join(
            (
                _FLAGS.pack(flags | _HEADERS_FLAG),
                properties_raw[2:position],
                _TABLE_SIZE.pack(len(entry)),
                entry,
                properties_raw[position:],
            )
        )
    except (struct.error, IndexError) as exc:
        raise AMQPSyntaxError("malformed content properties: truncated") from exc
