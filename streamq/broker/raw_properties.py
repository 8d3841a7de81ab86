"""Fields of a message's AMQP 0-9-1 properties, found without decoding them.

Owns the layout knowledge the broker core needs to read one property from the raw bytes
it keeps (`priority`, `expiration`): the 16-bit flag word, most significant bit first
(content-type, content-encoding, headers, delivery-mode, priority, correlation-id,
reply-to, expiration, ...), then the present fields in that order. `field_position`
skips the fields before the one asked for by their lengths; nothing is decoded.
"""

from __future__ import annotations

from typing import Final

CONTENT_TYPE_FLAG: Final = 0x80
CONTENT_ENCODING_FLAG: Final = 0x40
HEADERS_FLAG: Final = 0x20
DELIVERY_MODE_FLAG: Final = 0x10
PRIORITY_FLAG: Final = 0x08
CORRELATION_ID_FLAG: Final = 0x04
REPLY_TO_FLAG: Final = 0x02
EXPIRATION_FLAG: Final = 0x01
FLAGS_BYTES: Final = 2


def field_position(properties_raw: bytes, flag: int) -> int:
    """Where the field of `flag` (one of the first flag byte's, present) starts: the
    fields before it skipped. Raises IndexError when the bytes are short. Written out
    field by field: it runs on the publish path of priority and TTL queues."""
    flags = properties_raw[0]
    position = FLAGS_BYTES
    if flag == CONTENT_TYPE_FLAG:
        return position
    if flags & CONTENT_TYPE_FLAG:
        position += 1 + properties_raw[position]
    if flag == CONTENT_ENCODING_FLAG:
        return position
    if flags & CONTENT_ENCODING_FLAG:
        position += 1 + properties_raw[position]
    if flag == HEADERS_FLAG:
        return position
    if flags & HEADERS_FLAG:
        position += 4 + int.from_bytes(properties_raw[position : position + 4], "big")
    if flag == DELIVERY_MODE_FLAG:
        return position
    if flags & DELIVERY_MODE_FLAG:
        position += 1
    if flag == PRIORITY_FLAG:
        return position
    if flags & PRIORITY_FLAG:
        position += 1
    if flag == CORRELATION_ID_FLAG:
        return position
    if flags & CORRELATION_ID_FLAG:
        position += 1 + properties_raw[position]
    if flag == REPLY_TO_FLAG:
        return position
    if flags & REPLY_TO_FLAG:
        position += 1 + properties_raw[position]
    return position
