"""The Python `encode_deliver` that the C one (`amqp_gateway/codec/_deliver.c`) replaced,
kept as the reference its tests compare it with, byte for byte and error for error."""

from __future__ import annotations

import struct
from typing import Final

from amqp_gateway.codec.content import append_body_frames, append_content_header_frame
from amqp_gateway.codec.frame import FRAME_END, FRAME_METHOD
from amqp_gateway.codec.ids import ChannelId, DeliveryTag

# Frame envelope, class-id, method-id and the first shortstr's length, in one pack.
_METHOD_FRAME_START = struct.Struct(">BHIHHB")
# basic.deliver after the consumer tag: delivery-tag, redelivered, exchange length.
_DELIVER_MIDDLE = struct.Struct(">QBB")
_SHORTSTR_BYTES_MAX: Final = 255
_BASIC: Final = 60
_DELIVER: Final = 60


def _encoded(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    if len(raw) > _SHORTSTR_BYTES_MAX:
        raise ValueError(f"shortstr of {len(raw)} bytes exceeds {_SHORTSTR_BYTES_MAX}")
    return raw


def encode_deliver(
    out: bytearray,
    channel: ChannelId,
    consumer_tag: str | bytes,
    delivery_tag: DeliveryTag,
    redelivered: bool,
    exchange: str | bytes,
    routing_key: str | bytes,
    properties_raw: bytes,
    body: bytes | memoryview,
    frame_max: int,
) -> None:
    """Append basic.deliver, its content header and body frames to `out`.

    `properties_raw` is the property list in wire form (flag word first), as stored.
    Strings may be given already UTF-8 encoded. Raises `ValueError`, with nothing
    appended, when a shortstr exceeds 255 bytes or the properties exceed one frame.
    """
    consumer_tag_raw = _encoded(consumer_tag)
    exchange_raw = _encoded(exchange)
    routing_key_raw = _encoded(routing_key)
    # ids (4) + tag length and tag + delivery-tag (8) + bits (1) + two more shortstrs.
    size = 4 + 1 + len(consumer_tag_raw) + 9 + 1 + len(exchange_raw) + 1 + len(routing_key_raw)
    try:
        start = _METHOD_FRAME_START.pack(
            FRAME_METHOD, channel, size, _BASIC, _DELIVER, len(consumer_tag_raw)
        )
        middle = _DELIVER_MIDDLE.pack(delivery_tag, redelivered, len(exchange_raw))
    except struct.error as exc:
        raise ValueError(f"basic.deliver: cannot encode channel or delivery tag: {exc}") from exc
    mark = len(out)
    out += start
    out += consumer_tag_raw
    out += middle
    out += exchange_raw
    out.append(len(routing_key_raw))
    out += routing_key_raw
    out.append(FRAME_END)
    try:
        append_content_header_frame(out, channel, len(body), properties_raw, frame_max)
    except ValueError:
        del out[mark:]
        raise
    append_body_frames(out, channel, body, frame_max)
