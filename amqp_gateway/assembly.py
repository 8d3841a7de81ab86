"""Content assembly: a channel's basic.publish, content header and body frames become one
Publish event (sans-IO, part of the connection state machine).

Owns the protocol's view of one channel (`ProtocolChannel`: open or closing, and the
publish being assembled) and the frame-by-frame assembly of a publish's content, with
RabbitMQ's texts for content frames out of order (rabbit_command_assembler:process/2).
Every check comes before any state changes (connection.py, rule 3). It does not read
frames, nor decide what a channel error closes: amqp_gateway/connection.py hands it the
decoded frames and turns what it raises into a close. The fast path, which splits whole
publishes in C (`Connection._receive_publishes`), does not come through here.
"""

from __future__ import annotations

from typing import Final

from amqp_gateway import codec
from amqp_gateway.errors import FrameError, PreconditionFailed, UnexpectedFrame
from amqp_gateway.events import Event, Publish
from amqp_gateway.states import ChannelState

EXPECTED_METHOD_FRAME: Final = "expected method frame, got non method frame instead"
_EXPECTED_HEADER: Final = (
    "expected content header for class 60, got non content header frame instead"
)
_EXPECTED_BODY: Final = "expected content body, got non content body frame instead"
_BASIC_CLASS: Final = 60


class ProtocolChannel:
    """One channel as the protocol sees it: its state and the publish in assembly."""

    __slots__ = ("body", "body_size", "properties_raw", "publish", "received", "state")

    def __init__(self) -> None:
        self.state = ChannelState.OPEN
        self.publish: tuple[str, str, bool, bool] | None = None
        self.properties_raw = b""
        self.body_size = -1  # -1: no content header yet
        self.body: list[bytes] = []
        self.received = 0


def content_expected(channel: ProtocolChannel) -> UnexpectedFrame:
    """A method frame where the content of a basic.publish was to come."""
    return UnexpectedFrame(_EXPECTED_HEADER if channel.body_size < 0 else _EXPECTED_BODY, 60, 40)


def receive_content_header(
    channel_id: int,
    channel: ProtocolChannel,
    payload: bytes,
    message_bytes_max: int,
    events: list[Event],
) -> None:
    """Raises UnexpectedFrame for a header out of order or not of class basic, and
    PreconditionFailed for a body over `message_bytes_max`."""
    header = codec.decode_content_header(payload)
    if channel.publish is None:
        raise UnexpectedFrame(EXPECTED_METHOD_FRAME)
    if channel.body_size >= 0:
        raise UnexpectedFrame(_EXPECTED_BODY, 60, 40)
    if header.weight != 0:  # spec 4.2.6.1: weight is unused and must be zero
        raise UnexpectedFrame(_EXPECTED_HEADER, 60, 40)
    if header.class_id != _BASIC_CLASS:
        raise UnexpectedFrame(
            f"expected content header for class 60, got one for class {header.class_id} instead",
            60,
            40,
        )
    if header.body_size > message_bytes_max:
        # `fail` forgets the publish: no state changes before a raise (rule 3).
        raise PreconditionFailed(
            f"message size {header.body_size} is larger than configured max size "
            f"{message_bytes_max}",
            60,
            40,
        )
    channel.properties_raw = header.properties_raw
    channel.body_size = header.body_size
    if header.body_size == 0:
        _complete_publish(channel_id, channel, events)


def receive_body(
    channel_id: int, channel: ProtocolChannel, payload: bytes, events: list[Event]
) -> None:
    """Raises UnexpectedFrame for a body out of order, FrameError for one past the size
    the content header announced."""
    if channel.body_size < 0:
        if channel.publish is None:
            raise UnexpectedFrame(EXPECTED_METHOD_FRAME)
        raise UnexpectedFrame(_EXPECTED_HEADER, 60, 40)
    received = channel.received + len(payload)
    if received > channel.body_size:  # checked first: no state changes before a raise
        raise FrameError(f"content body of {received} bytes exceeds {channel.body_size}")
    channel.body.append(payload)
    channel.received = received
    if received == channel.body_size:
        _complete_publish(channel_id, channel, events)


def _complete_publish(channel_id: int, channel: ProtocolChannel, events: list[Event]) -> None:
    publish = channel.publish
    assert publish is not None
    body = channel.body[0] if len(channel.body) == 1 else b"".join(channel.body)
    exchange, routing_key, mandatory, immediate = publish
    events.append(
        Publish(
            channel_id,
            exchange,
            routing_key,
            mandatory,
            immediate,
            channel.properties_raw,
            body,
        )
    )
    channel.publish = None
    channel.body_size = -1
    channel.body = []
    channel.received = 0
