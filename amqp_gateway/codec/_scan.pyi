"""Typed stub of the C extension `amqp_gateway/codec/_scan.c` (see its module docstring).

A message is `(properties_raw, body, exchange, routing_key, bits)`, fields as in
`basic.PublishedMessage`; bits: mandatory = 1, immediate = 2.
"""

from typing_extensions import Buffer

def scan_publishes(
    data: Buffer,
    position: int,
    payload_max: int,
    body_bytes_max: int,
    count_max: int,
    /,
) -> tuple[int, int, list[tuple[bytes, bytes, str, str, int]], int, int]:
    """Read consecutive whole basic.publish messages from `data` at `position`.

    Returns `(channel, end, messages, bits, flags)`: the messages `basic.read_publish`
    accepts one after another, with the first one's channel, exchange and routing key,
    with bodies of at most `body_bytes_max` bytes, at most `count_max` of them; `end` is
    the offset after the last frame read; `bits` the OR of their bits, `flags` the OR
    of their property flag words (16 bits, big-endian). `(0, position, [], 0, 0)` when
    none is accepted. Never raises for the bytes it reads.

    Raises TypeError when `data` has no buffer or an argument is not an integer,
    BufferError for a non-contiguous buffer, and ValueError for a negative argument,
    `position > len(data)` or `count_max < 1`.
    """
