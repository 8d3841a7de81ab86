"""Message priorities: the `priority` property of a message, read without decoding.

Owns one question: which priority a published message asked for. The broker core keeps
each message's AMQP properties as the publisher sent them; a priority queue needs the
`priority` field of every message it takes, on the publish path and when it is restored
at start-up (before any gateway is attached), so this module reads that one octet from
the raw properties itself, the way `deadletter.may_expire` reads a flag bit. It must not
decode anything else.
"""

from __future__ import annotations

from typing import Final

# AMQP 0-9-1 basic properties start with a 16-bit flag word, most significant bit first:
# content-type, content-encoding, headers, delivery-mode, priority, ... The fields that
# are present follow in that order, so the priority octet comes after the first four.
CONTENT_TYPE_FLAG: Final = 0x80
CONTENT_ENCODING_FLAG: Final = 0x40
HEADERS_FLAG: Final = 0x20
DELIVERY_MODE_FLAG: Final = 0x10
PRIORITY_FLAG_BYTE0: Final = 0x08
FLAGS_BYTES: Final = 2


def message_priority(properties_raw: bytes) -> int:
    """The message's `priority` (0 to 255); 0 when it has none or the bytes are short."""
    if len(properties_raw) <= FLAGS_BYTES or not properties_raw[0] & PRIORITY_FLAG_BYTE0:
        return 0
    flags = properties_raw[0]
    position = FLAGS_BYTES
    try:
        if flags & CONTENT_TYPE_FLAG:
            position += 1 + properties_raw[position]
        if flags & CONTENT_ENCODING_FLAG:
            position += 1 + properties_raw[position]
        if flags & HEADERS_FLAG:
            position += 4 + int.from_bytes(properties_raw[position : position + 4], "big")
        if flags & DELIVERY_MODE_FLAG:
            position += 1
        return properties_raw[position]
    except IndexError:
        return 0  # the gateway checked the frame's length; this cannot happen
