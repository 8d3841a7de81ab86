"""Method frame payloads: class id, method id and the method's arguments.

This module owns the generic, table-driven encoding of every method in `spec.py` into
and out of the dataclasses of `methods.py` (spec 4.2.4 and 4.2.5): fields in wire order,
consecutive bits packed into octets from the least significant bit, a payload that must
be consumed exactly. The per-message methods (basic.publish, basic.ack) are dispatched to
the hand-written decoders of `basic.py` instead (STYLE.md section 11).

Error mapping, at this one boundary:
- a method payload shorter than its 4 id octets is a malformed frame: `FrameError` (501),
  as RabbitMQ's rabbit_command_assembler:analyze_frame/3 reports it;
- an unknown (class_id, method_id) is `AMQPNotImplemented` (540). RabbitMQ has no reply
  for this: rabbit_framing_amqp_0_9_1:lookup_method_name/1 exits with
  `{unknown_method_id, Id}` and the reader drops the socket without Connection.Close.
  We answer instead, with the code the spec gives for "the client tried to use
  functionality that is not implemented in the server";
- a payload whose fields do not decode (truncated, trailing bytes, bad UTF-8 in a
  shortstr, a malformed table) is `AMQPSyntaxError` (502) carrying the method's ids.
  RabbitMQ sends 501 here (rabbit_misc:frame_error/2, "cannot decode"); we keep 501 for
  framing alone and use the spec's code for illegal field values.

Rules:
1. Pure functions, no state; nothing but the typed errors above escapes a decoder.
2. Encoders raise `ValueError` for a value the wire cannot carry (a programmer error).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from amqp_gateway.codec import basic
from amqp_gateway.codec.content import append_body_frames, append_content_header_frame
from amqp_gateway.codec.erlang_text import frame_error_text
from amqp_gateway.codec.frame import FRAME_METHOD, append_frame
from amqp_gateway.codec.ids import ChannelId
from amqp_gateway.codec.methods import METHOD_TYPES, AnyMethod, Method
from amqp_gateway.codec.spec import METHODS, Kind
from amqp_gateway.codec.values import (
    read_longstr,
    read_shortstr,
    read_table,
    write_longstr,
    write_shortstr,
    write_table,
)
from amqp_gateway.errors import AMQPNotImplemented, AMQPSyntaxError, FrameError

_IDS = struct.Struct(">HH")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

_Plan = tuple[tuple[str, Kind], ...]
_PLANS: Final[dict[tuple[int, int], _Plan]] = {
    key: tuple((field.name, field.kind) for field in spec.fields) for key, spec in METHODS.items()
}
_FACTORIES: Final[dict[tuple[int, int], Callable[..., AnyMethod]]] = dict(METHOD_TYPES)
_FAST_DECODERS: Final[dict[tuple[int, int], Callable[[bytes], AnyMethod]]] = {
    (60, 40): basic.decode_basic_publish,
    (60, 80): basic.decode_basic_ack,
}


def _read_int(layout: struct.Struct) -> Callable[[bytes, int], tuple[int, int]]:
    def read(buf: bytes, offset: int) -> tuple[int, int]:
        return layout.unpack_from(buf, offset)[0], offset + layout.size

    return read


def _read_octet(buf: bytes, offset: int) -> tuple[int, int]:
    return buf[offset], offset + 1


_READERS: Final[dict[Kind, Callable[[bytes, int], tuple[Any, int]]]] = {
    Kind.OCTET: _read_octet,
    Kind.SHORT: _read_int(_U16),
    Kind.LONG: _read_int(_U32),
    Kind.LONGLONG: _read_int(_U64),
    Kind.TIMESTAMP: _read_int(_U64),
    Kind.SHORTSTR: read_shortstr,
    Kind.LONGSTR: read_longstr,
    Kind.TABLE: read_table,
}


def decode_method(payload: bytes) -> AnyMethod:
    """Decode a method frame's payload into its dataclass.

    Raises `FrameError` (501), `AMQPNotImplemented` (540) or `AMQPSyntaxError` (502) as
    the module docstring describes.
    """
    if len(payload) < _IDS.size:
        raise FrameError(frame_error_text(FRAME_METHOD, payload, "unknown_frame"))
    key = _IDS.unpack_from(payload)
    fast = _FAST_DECODERS.get(key)
    if fast is not None:
        return fast(payload)
    factory = _FACTORIES.get(key)
    if factory is None:
        raise AMQPNotImplemented(f"unknown method {key[0]}.{key[1]}", key[0], key[1])
    try:
        values, offset = _read_fields(_PLANS[key], payload)
    except AMQPSyntaxError as exc:
        raise AMQPSyntaxError(f"{METHODS[key].full_name}: {exc.reply_text}", *key) from exc
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise AMQPSyntaxError(f"{METHODS[key].full_name}: truncated or invalid", *key) from exc
    if offset != len(payload):
        extra = len(payload) - offset
        raise AMQPSyntaxError(f"{METHODS[key].full_name}: {extra} bytes after the fields", *key)
    return factory(*values)


def _read_fields(plan: _Plan, payload: bytes) -> tuple[list[Any], int]:
    """Read the argument values after the 4 id octets; may raise low-level errors."""
    values: list[Any] = []
    offset = _IDS.size
    octet = 0
    bit = 8  # 8 means "no octet of bits open": the next bit field reads a new one.
    for _name, kind in plan:
        if kind is Kind.BIT:
            if bit == 8:
                octet = payload[offset]
                offset += 1
                bit = 0
            values.append(bool(octet >> bit & 1))
            bit += 1
            continue
        bit = 8
        value, offset = _READERS[kind](payload, offset)
        values.append(value)
    return values, offset


def _write_octet(out: bytearray, value: int) -> None:
    out.append(value)


def _write_int(layout: struct.Struct) -> Callable[[bytearray, int], None]:
    def write(out: bytearray, value: int) -> None:
        out += layout.pack(value)

    return write


_WRITERS: Final[dict[Kind, Callable[[bytearray, Any], None]]] = {
    Kind.OCTET: _write_octet,
    Kind.SHORT: _write_int(_U16),
    Kind.LONG: _write_int(_U32),
    Kind.LONGLONG: _write_int(_U64),
    Kind.TIMESTAMP: _write_int(_U64),
    Kind.SHORTSTR: write_shortstr,
    Kind.LONGSTR: write_longstr,
    Kind.TABLE: write_table,
}


def write_method_payload(out: bytearray, method: Method) -> None:
    """Append the payload of a method frame (ids and arguments).

    Raises `ValueError` when a field value does not fit its wire type.
    """
    spec = method.SPEC
    out += _IDS.pack(spec.class_id, spec.method_id)
    octet = 0
    bit = 0  # bits already packed into `octet`
    try:
        for name, kind in _PLANS[spec.class_id, spec.method_id]:
            value = getattr(method, name)
            if kind is Kind.BIT:
                if bit == 8:
                    out.append(octet)
                    octet = bit = 0
                octet |= bool(value) << bit
                bit += 1
                continue
            if bit:
                out.append(octet)
                octet = bit = 0
            _WRITERS[kind](out, value)
    except (struct.error, OverflowError, TypeError) as exc:
        raise ValueError(f"{spec.full_name}: cannot encode a field: {exc}") from exc
    if bit:
        out.append(octet)


def encode_method_payload(method: Method) -> bytes:
    """The payload of a method frame. Raises `ValueError` as `write_method_payload`."""
    out = bytearray()
    write_method_payload(out, method)
    return bytes(out)


def append_method_frame(out: bytearray, channel: ChannelId, method: Method) -> None:
    """Append a whole method frame. Raises `ValueError` as `write_method_payload`.

    The caller keeps methods within frame_max; only a huge table could exceed it.
    """
    append_frame(out, FRAME_METHOD, channel, encode_method_payload(method))


def encode_method_frame(channel: ChannelId, method: Method) -> bytes:
    """A whole method frame as bytes. Raises `ValueError` as `write_method_payload`."""
    out = bytearray()
    append_method_frame(out, channel, method)
    return bytes(out)


def append_content_frames(
    out: bytearray,
    channel: ChannelId,
    method: Method,
    properties_raw: bytes,
    body: bytes | memoryview,
    frame_max: int,
) -> None:
    """Append a content-carrying method (basic.return, basic.get-ok, basic.publish...)
    with its content header and body frames; deliveries use `basic.encode_deliver`.

    Raises `ValueError` as `write_method_payload` and when the properties exceed a frame.
    """
    assert method.CONTENT, f"{method.NAME} carries no content"
    start = len(out)
    try:
        append_method_frame(out, channel, method)
        append_content_header_frame(
            out, channel, len(body), properties_raw, frame_max, method.CLASS_ID
        )
    except ValueError:
        del out[start:]
        raise
    append_body_frames(out, channel, body, frame_max)
