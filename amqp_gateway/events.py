"""The events the sans-IO connection (amqp_gateway/connection.py) hands to the server.

Owns the vocabulary between the protocol and the session: a login or open to decide on,
publishes (one at a time, or a run of them split by the fast path), runs of acks, any
other method for the server to handle, and the ends of channels and of the connection.
Events are plain values: they hold no state of the connection and do nothing themselves.
The hot-path ones (`Publish`, `PublishRun`, `AckRun`) are NamedTuples, cheaper to build
than dataclasses (STYLE.md section 11).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple

from amqp_gateway import codec
from amqp_gateway.codec import methods as m


@dataclass(frozen=True, slots=True)
class LoginRequested:
    mechanism: str
    username: str
    password: str
    client_properties: codec.FieldTable


@dataclass(frozen=True, slots=True)
class OpenRequested:
    virtual_host: str


class Publish(NamedTuple):
    """A basic.publish with its content assembled (hot path: a tuple, not a dataclass)."""

    channel: int
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool
    properties_raw: bytes
    body: bytes


# One publish of a run: properties_raw, body, exchange, routing key, bits (mandatory = 1,
# immediate = 2), as `codec.scan_publishes` builds it.
RunMessage = tuple[bytes, bytes, str, str, int]


class PublishRun(NamedTuple):
    """Whole publishes in a row on one channel with one exchange and routing key, split
    from one read by the fast path: one event for the lot, not one per message (STYLE.md
    section 11). Equal consecutive properties share one bytes object."""

    channel: int
    messages: list[RunMessage]
    bits: int  # the OR of the messages' bits
    flags: int  # the OR of their property flag words (16 bits, big-endian)


class AckRun(NamedTuple):
    """basic.ack, basic.nack and basic.reject methods in a row on one channel, split from
    one read by the fast path (`codec.scan_acks`): one event for the lot, not a method
    object per ack (STYLE.md section 11). Entry i is `tags[i]` with the kind bits
    `kinds[i]` (codec.ACK_MULTIPLE, ACK_REQUEUE, ACK_NACK, ACK_REJECT; 0 is a plain
    basic.ack), in the order the client sent them."""

    channel: int
    tags: list[int]
    kinds: bytes
    flags: int  # the OR of the kinds: 0 when every entry is a plain basic.ack


@dataclass(frozen=True, slots=True)
class MethodReceived:
    channel: int
    method: m.Method


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """The channel is gone (either side closed it); the server releases its state."""

    channel: int


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The close handshake is over: flush `outgoing`, then drop the socket."""

    reply_code: int
    reply_text: str


Event = (
    LoginRequested
    | OpenRequested
    | Publish
    | PublishRun
    | AckRun
    | MethodReceived
    | ChannelClosed
    | ConnectionClosed
)

# Messages handled per drain while deliveries are pending (a PublishRun counts each of
# its messages, an AckRun each of its tags, any other event one).
EVENTS_PER_SLICE: Final = 512


def slice_end(events: list[Event]) -> int:
    """How many of `events` make one slice: EVENTS_PER_SLICE messages, at least one event."""
    weight = 0
    for index, event in enumerate(events):
        if type(event) is PublishRun:
            weight += len(event.messages)
        elif type(event) is AckRun:
            continue  # it gives deliveries their turns itself, piece by piece (settle_ack_run)
        else:
            weight += 1
        if weight > EVENTS_PER_SLICE:
            return max(index, 1)
    return len(events)
