"""Content frames: the content header frame and the body frames that follow a method.

This module owns the payload of a content header frame (spec 4.2.6)::

    class-id  weight  body-size  property flags + property list
    short     short   longlong   (kept as raw bytes: `properties_raw`)

and the splitting of a body into body frames of at most `frame_max - 8` bytes.
`properties_raw` is handed over undecoded, since the broker stores it as it arrived;
`properties.decode_properties` looks inside when needed.

Rules:
1. Pure functions, no state. Decoding raises only `FrameError` (501); it does not judge
   `weight` or `class_id`, which the protocol layer checks against the method before it
   (RabbitMQ answers both with UNEXPECTED_FRAME, rabbit_command_assembler:process/2).
2. Encoders raise `ValueError` for a header that cannot fit in one frame.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from amqp_gateway.codec.erlang_text import frame_error_text
from amqp_gateway.codec.frame import FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_OVERHEAD_BYTES
from amqp_gateway.codec.ids import ChannelId
from amqp_gateway.codec.spec import BASIC_CLASS_ID
from amqp_gateway.errors import FrameError

_HEADER_FIELDS = struct.Struct(">HHQ")
_FRAME_ENVELOPE = struct.Struct(">BHI")
# Envelope and header fields in one pack: type, channel, size, class-id, weight, body-size.
_HEADER_FRAME_START = struct.Struct(">BHIHHQ")
CONTENT_HEADER_FIELDS_BYTES: Final = _HEADER_FIELDS.size
"""class-id, weight and body-size: 12 bytes before the properties."""
_PROPERTY_FLAGS_BYTES: Final = 2
_CHANNEL_MAX: Final = 65535
_new = tuple.__new__


class ContentHeader(NamedTuple):
    """A decoded content header frame payload; `properties_raw` starts at the flag word.

    A NamedTuple, not a dataclass: one is built per published message, and a tuple is
    cheaper to create (decoding takes 0.31 vs 0.72 us, measured; STYLE.md section 11).
    """

    class_id: int
    weight: int
    body_size: int
    properties_raw: bytes


def decode_content_header(payload: bytes) -> ContentHeader:
    """Split a content header frame's payload into its fields and the raw properties.

    Raises `FrameError` (501) when the payload is too short to hold the fixed fields and
    the property flag word, as RabbitMQ's analyze_frame treats it as an unknown frame.
    """
    if len(payload) < CONTENT_HEADER_FIELDS_BYTES + _PROPERTY_FLAGS_BYTES:
        raise FrameError(frame_error_text(FRAME_HEADER, payload, "unknown_frame"))
    class_id, weight, body_size = _HEADER_FIELDS.unpack_from(payload)
    return _new(ContentHeader, (class_id, weight, body_size, payload[CONTENT_HEADER_FIELDS_BYTES:]))


def append_content_header_frame(
    out: bytearray,
    channel: ChannelId,
    body_size: int,
    properties_raw: bytes,
    frame_max: int,
    class_id: int = BASIC_CLASS_ID,
) -> None:
    """Append a content header frame carrying `properties_raw` unchanged.

    Raises `ValueError`, appending nothing, when the properties do not fit in one frame of
    `frame_max` (the spec has no way to split them) or a number is out of range.
    """
    size = CONTENT_HEADER_FIELDS_BYTES + len(properties_raw)
    if size > frame_max - FRAME_OVERHEAD_BYTES:
        raise ValueError(f"content header of {size} bytes exceeds frame_max {frame_max}")
    try:
        start = _HEADER_FRAME_START.pack(FRAME_HEADER, channel, size, class_id, 0, body_size)
    except struct.error as exc:
        raise ValueError(f"cannot encode a content header: {exc}") from exc
    out += start
    out += properties_raw
    out.append(FRAME_END)


def append_body_frames(
    out: bytearray, channel: ChannelId, body: bytes | memoryview, frame_max: int
) -> None:
    """Append the body frames for `body`: none for an empty body, else pieces of at most
    `frame_max - 8` bytes. Raises `ValueError`, appending nothing, for a bad channel."""
    size = len(body)
    piece_max = frame_max - FRAME_OVERHEAD_BYTES
    assert piece_max > 0, "frame_max must leave room for a payload"
    if not 0 <= channel <= _CHANNEL_MAX:
        raise ValueError(f"channel {channel} out of range")
    if size <= piece_max:
        if size:
            out += _FRAME_ENVELOPE.pack(FRAME_BODY, channel, size)
            out += body
            out.append(FRAME_END)
        return
    with memoryview(body) as view:
        for start in range(0, size, piece_max):
            piece = view[start : start + piece_max]
            out += _FRAME_ENVELOPE.pack(FRAME_BODY, channel, len(piece))
            out += piece
            out.append(FRAME_END)
