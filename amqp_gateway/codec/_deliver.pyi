"""Typed stub of the C extension `amqp_gateway/codec/_deliver.c` (see its module docstring).

Same signature as `basic.encode_deliver`, of which it is a drop-in replacement.
"""

from typing_extensions import Buffer

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

def deliver_records(
    out: bytearray,
    records: Buffer,
    position: int,
    first_offset: int,
    count: int,
    channel: int,
    consumer_tag: str | bytes,
    first_delivery_tag: int,
    frame_max: int,
    out_bytes_max: int,
    /,
) -> tuple[int, int, int, list[int]]:
    """Append the deliveries of the segment-log records at offsets `first_offset` ..
    `first_offset + count - 1` found in `records` from `position` on (records below
    `first_offset` are passed over): basic.deliver with delivery tags from
    `first_delivery_tag` on, redelivered false, each record's exchange, routing key,
    properties and body. Stops at the end of the whole records given, after `count`, or
    once `out_bytes_max` bytes were appended (at least one delivery; 0: no limit).

    Returns `(delivered, position, next_offset, sizes)`: how many, where the next record
    starts and its offset (-1 when no record was read), and each body's size. Raises
    ValueError, appending nothing, for a damaged record or an offset out of sequence.
    """

def deliver_stream_records(
    out: bytearray,
    records: Buffer,
    position: int,
    first_offset: int,
    count: int,
    channel: int,
    consumer_tag: str | bytes,
    first_delivery_tag: int,
    frame_max: int,
    out_bytes_max: int,
    stream_key: Buffer | None = None,
    /,
) -> tuple[int, int, int, bool]:
    """`deliver_records` for a stream: each delivery's properties carry the header
    `x-stream-offset` (a long, the record's offset), spliced in byte for byte as
    `properties.add_long_header` does. With `stream_key` (the stream's name in UTF-8), a
    stream client's native record is delivered as `amqp10.as_amqp091` converts it (in C);
    without, or where that conversion leaves it to Python, it stops the run.

    Stops, besides where `deliver_records` stops, before a record it leaves to the
    per-record path: properties that already hold the name x-stream-offset, cannot be
    spliced simply, or would no longer fit one frame. Returns `(delivered, position,
    next_offset, stopped)`: how many, where the next record starts and its offset (-1
    when no record was read), and whether it stopped before such a record (then
    `position` and `next_offset` are that record's). Raises ValueError, appending
    nothing, for a damaged record or an offset out of sequence.
    """
