"""Typed stub of the C extension `amqp_gateway/codec/_scan.c` (see its module docstring).

A message is `(properties_raw, body, exchange, routing_key, bits)`, fields as in
`basic.PublishedMessage`; bits: mandatory = 1, immediate = 2.
"""

from typing import Final

from typing_extensions import Buffer

# The kind bits of a `scan_acks` entry; a plain basic.ack (multiple=false) is 0.
ACK_MULTIPLE: Final[int]  # 1: multiple (ack, nack)
ACK_REQUEUE: Final[int]  # 2: requeue (nack, reject)
ACK_NACK: Final[int]  # 4: a basic.nack
ACK_REJECT: Final[int]  # 8: a basic.reject

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

def scan_acks(
    data: Buffer,
    position: int,
    payload_max: int,
    count_max: int,
    /,
) -> tuple[int, int, list[int], bytes, int]:
    """Read consecutive basic.ack, basic.nack and basic.reject methods on one channel
    from `data` at `position`.

    Returns `(channel, end, tags, kinds, flags)`: the delivery tags in frame order, one
    kind byte per tag (`ACK_MULTIPLE` 1, `ACK_REQUEUE` 2, `ACK_NACK` 4, `ACK_REJECT` 8; a
    plain basic.ack is 0), the OR of the kinds, and `end`, the offset after the last
    frame read. A frame is taken exactly when `read_frame` and `decode_method` accept it,
    on the first frame's channel, at most `count_max` of them; empty heartbeats between
    two are skipped. `(0, position, [], b"", 0)` when none is accepted. Never raises for
    the bytes it reads.

    Raises TypeError when `data` has no buffer or an argument is not an integer,
    BufferError for a non-contiguous buffer, and ValueError for a negative argument,
    `position > len(data)` or `count_max < 1`.
    """
