"""Per-message expirations: the `expiration` property of a message, read without decoding,
and the bound a queue keeps on when its queued messages' own expirations come.

Owns two things. `expiration_ms` reads the one property a per-message TTL needs from the
raw properties, the way `priority.message_priority` reads a priority: the fields before
it are skipped by their lengths, nothing is decoded. `Queue.own_expiry_min_ms` is a lower
bound on the deadline (publish timestamp + own expiration) of every never-delivered
message the queue holds: the publisher lowers it (`lower_bound`), a delivery round
resets it once the queue has no ready message left (`EXPIRY_NONE`), and a restart sets
it to `EXPIRY_UNKNOWN`. While the clock is before it, no never-delivered message of the
queue can have expired by its own expiration, so a run of them goes out whole without
reading each record (`delivery.unexpired_runs`). It must not be raised by anything but
that reset: a bound too high would deliver an expired message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from streamq.broker.raw_properties import EXPIRATION_FLAG, FLAGS_BYTES, field_position

if TYPE_CHECKING:
    from streamq.broker.queue import Queue

EXPIRY_NONE: Final = 1 << 62
"""`Queue.own_expiry_min_ms` of a queue that holds no never-delivered message with an
expiration of its own (ms since the epoch: never)."""
EXPIRY_UNKNOWN: Final = 0
"""`Queue.own_expiry_min_ms` when the deadlines are not known (restored at start-up, or
an expiration this module cannot read): every run is checked message by message."""


def expiration_ms(properties_raw: bytes) -> int | None:
    """The message's `expiration` in ms; None without one, or when it is not a plain
    integer (such a publish was refused: see `amqp_gateway.routing.expiration_problem`),
    or the bytes are short."""
    if len(properties_raw) <= FLAGS_BYTES or not properties_raw[0] & EXPIRATION_FLAG:
        return None
    try:
        position = field_position(properties_raw, EXPIRATION_FLAG)
        size = properties_raw[position]
        text = properties_raw[position + 1 : position + 1 + size]
    except IndexError:
        return None
    digits = text[1:] if text[:1] in (b"+", b"-") else text
    if len(text) != size or not digits.isdigit():
        return None  # the same test as RabbitMQ's parse: a sign, digits, nothing more
    return int(text)


def deadline_ms(properties_raw: bytes, timestamp_ms: int) -> int:
    """When a message published at `timestamp_ms` with these properties expires by its
    own expiration; EXPIRY_UNKNOWN if it has the flag but no readable value."""
    own = expiration_ms(properties_raw)
    return EXPIRY_UNKNOWN if own is None else timestamp_ms + max(own, 0)


def lower_bound(queues: list[Queue], deadline: int) -> None:
    """Messages expiring at `deadline` were enqueued on `queues`."""
    for queue in queues:
        queue.own_expiry_min_ms = min(queue.own_expiry_min_ms, deadline)
