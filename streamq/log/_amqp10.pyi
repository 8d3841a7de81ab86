"""Types of the C extension `streamq.log._amqp10` (source: `_amqp10.c`, `_amqp10_convert.h`).

Stream-native records' AMQP 1.0 messages as AMQP 0-9-1 readers get them: exactly
`amqp10.to_amqp091_reference`'s result, or None where only the Python converts. No I/O.
"""

from typing_extensions import Buffer

def convert(
    body: Buffer, stream_key: Buffer, filter_value: Buffer, /
) -> tuple[bytes, bytes, bytes, bytes] | None:
    """`(exchange, routing_key, properties, body)` of a native record whose AMQP 1.0
    message is `body` and filter value `filter_value`, in the stream named `stream_key`
    (UTF-8); None when the message holds what only the Python converts (amqp-value,
    amqp-sequence or footer sections, arrays, chars, described values, malformed bytes)."""

def convert_records(
    buffer: Buffer,
    positions: Buffer,
    ends: Buffer,
    exchange_lens: Buffer,
    routing_key_lens: Buffer,
    properties_lens: Buffer,
    stream_key: Buffer,
    /,
) -> tuple[tuple[bytes, bytes], ...] | None:
    """The records of `buffer` (int64 arrays of positions, ends and field lengths) as
    AMQP 0-9-1 readers see them, native ones converted as `convert` does: four (data,
    int32 offsets) pairs, for exchange, routing key, properties and body, each an Arrow
    binary column's buffers. None when a record is the Python's or a column passes 2 GiB.
    Raises ValueError when the arrays' sizes differ."""

def split_properties(
    data: Buffer, offsets: Buffer, /
) -> tuple[tuple[bytes, bytes] | tuple[bytes, bytes, bytes], ...] | None:
    """The AMQP 0-9-1 property lists of a binary column (`data`, int32 `offsets`) split
    into the 14 properties (amqp091.PROPERTY_NAMES order): (data, offsets, valid) for the
    shortstrs and the headers (the field table with its size field), (values, valid) for
    delivery_mode and priority (int32) and timestamp (int64 microseconds); `valid` one
    byte per row. None when a list is malformed or a timestamp's microseconds pass an
    int64. Raises ValueError for offsets that do not fit `data`."""
