"""Typed stub of the C extension `amqp_gateway/codec/_deliver.c` (see its module docstring).

Same signature as `basic.encode_deliver`, of which it is a drop-in replacement.
"""

from amqp_gateway.codec.ids import ChannelId, DeliveryTag

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
    appended, when a shortstr exceeds 255 bytes, the properties exceed one frame, or the
    channel or delivery tag is out of range. Raises TypeError for an argument of the
    wrong type or a non-contiguous buffer, UnicodeEncodeError for a str with lone
    surrogates and BufferError when `out` is exported; nothing is appended then either.
    """
