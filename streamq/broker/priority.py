"""Message priorities: the `priority` property of a message, read without decoding.

Owns one question: which priority a published message asked for. The broker core keeps
each message's AMQP properties as the publisher sent them; a priority queue needs the
`priority` field of every message it takes, on the publish path and when it is restored
at start-up (before any gateway is attached), so this module reads that one octet from
the raw properties itself (`raw_properties.field_position`), the way
`deadletter.may_expire` reads a flag bit. It must not decode anything else.
"""

from __future__ import annotations

from streamq.broker.raw_properties import FLAGS_BYTES, PRIORITY_FLAG, field_position


def message_priority(properties_raw: bytes) -> int:
    """The message's `priority` (0 to 255); 0 when it has none or the bytes are short."""
    if len(properties_raw) <= FLAGS_BYTES or not properties_raw[0] & PRIORITY_FLAG:
        return 0
    try:
        return properties_raw[field_position(properties_raw, PRIORITY_FLAG)]
    except IndexError:
        return 0  # the gateway checked the frame's length; this cannot happen
