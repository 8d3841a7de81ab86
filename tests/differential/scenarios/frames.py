"""Framing: frame_max at its boundary, malformed frames, content frames out of order,
undecodable method payloads. Every frame here is built by hand (codec and struct), since
the point is to send what a well-behaved client never would."""

from __future__ import annotations

import struct
from collections.abc import Callable

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from tests.differential.harness import Conn, Session, scenario
from tests.differential.scenarios.connection import (
    method_frame,
    raw_connect,
    read_start,
    refused_quietly,
    until_close,
)

FRAME_MAX = 4096  # what the scenarios negotiate, so a boundary frame stays small


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return codec.encode_frame(frame_type, codec.ChannelId(channel), payload)


def publish_method(channel: int, exchange: str, routing_key: str) -> bytes:
    return method_frame(channel, m.BasicPublish(exchange=exchange, routing_key=routing_key))


def header(channel: int, body_size: int, *, class_id: int = 60, weight: int = 0) -> bytes:
    payload = struct.pack(">HHQ", class_id, weight, body_size) + codec.EMPTY_PROPERTIES_RAW
    return frame(codec.FRAME_HEADER, channel, payload)


def body(channel: int, data: bytes) -> bytes:
    return frame(codec.FRAME_BODY, channel, data)


def method_payload(method: codec.Method) -> bytes:
    return codec.encode_method_payload(method)


def queue_ready(s: Session) -> Conn:
    """A connection (frame_max 4096) with channel 1 open and the scenario's queue."""
    c = s.connect(frame_max=FRAME_MAX)
    c.open(1)
    c.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))
    return c


def get_one(c: Conn, s: Session) -> None:
    c.call(1, m.BasicGet(queue=s.name(), no_ack=True))


# -- frame_max --------------------------------------------------------------------------------


def _body_frame_of(size: int) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = queue_ready(s)
        data = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
        c.client.send_raw(publish_method(1, "", s.name()) + header(1, size) + body(1, data))
        c.sync(1)
        get_one(c, s)

    return run


for _label, _size in (
    ("frame_max - 8 (the spec's limit)", FRAME_MAX - 8),
    ("exactly frame_max", FRAME_MAX),
    ("frame_max + 1", FRAME_MAX + 1),
    ("far above frame_max", 4 * FRAME_MAX),
):
    scenario(f"frames: a body frame payload of {_label}")(_body_frame_of(_size))


@scenario("frames: a method frame payload of exactly frame_max")
def _method_at_frame_max(s: Session) -> None:
    c = s.connect(frame_max=FRAME_MAX)
    c.open(1)
    base = m.QueueDeclare(queue=s.name(), exclusive=True, arguments={"pad": ""})
    pad = FRAME_MAX - len(method_payload(base))
    declare = m.QueueDeclare(queue=s.name(), exclusive=True, arguments={"pad": "p" * pad})
    assert len(method_payload(declare)) == FRAME_MAX
    c.call(1, declare)


@scenario("frames: a body split into one-byte frames")
def _tiny_bodies(s: Session) -> None:
    c = queue_ready(s)
    data = b"abcdefghij"
    frames = b"".join(body(1, data[i : i + 1]) for i in range(len(data)))
    c.client.send_raw(publish_method(1, "", s.name()) + header(1, len(data)) + frames)
    c.sync(1)
    get_one(c, s)


@scenario("frames: content of two channels interleaved")
def _interleaved(s: Session) -> None:
    # One queue per channel: RabbitMQ's two channels route in no set order to one queue.
    c = queue_ready(s)
    c.open(2)
    c.call(2, m.QueueDeclare(queue=s.name("q2"), exclusive=True))
    c.client.send_raw(
        publish_method(1, "", s.name())
        + publish_method(2, "", s.name("q2"))
        + header(2, 2)
        + header(1, 2)
        + body(1, b"1a")
        + body(2, b"2a")
    )
    c.sync(1)
    c.sync(2)
    get_one(c, s)
    c.call(1, m.BasicGet(queue=s.name("q2"), no_ack=True))


@scenario("frames: a heartbeat between content header and body")
def _heartbeat_in_content(s: Session) -> None:
    c = queue_ready(s)
    c.client.send_raw(
        publish_method(1, "", s.name()) + header(1, 2) + codec.HEARTBEAT_FRAME + body(1, b"ok")
    )
    c.sync(1)
    get_one(c, s)


@scenario("frames: a frame above 4096 bytes before tune-ok")
def _big_start_ok(s: Session) -> None:
    c = raw_connect(s)
    c.client.send_raw(codec.PROTOCOL_HEADER_0_9_1)
    read_start(c)
    properties = {"product": "x" * 5000}
    start_ok = m.ConnectionStartOk(
        client_properties=properties, mechanism="PLAIN", response=b"\x00guest\x00guest"
    )
    c.client.send_raw(method_frame(0, start_ok))
    refused_quietly(c)


# -- malformed frames -------------------------------------------------------------------------


def _connection_error(make: Callable[[Session], bytes], socket: bool) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = queue_ready(s)
        c.client.send_raw(make(s))
        until_close(c, socket=socket)

    return run


_MALFORMED = {
    "an unknown frame type": lambda s: frame(5, 1, b"abc"),
    "frame type 4": lambda s: frame(4, 1, b""),
    "an unknown frame type with Latin-1 octets": lambda s: frame(5, 1, b"caf\xe9"),
    "a bad frame-end octet": lambda s: method_frame(1, m.BasicQos(prefetch_count=1))[:-1] + b"\xcd",
    "a content header with no publish": lambda s: header(1, 3),
    "a body frame with no publish": lambda s: body(1, b"abc"),
    "a body frame after publish, before its header": lambda s: (
        publish_method(1, "", s.name()) + body(1, b"abc")
    ),
    "a body frame after a complete zero-size content": lambda s: (
        publish_method(1, "", s.name()) + header(1, 0) + body(1, b"abc")
    ),
    "a content header with class id 50": lambda s: (
        publish_method(1, "", s.name()) + header(1, 3, class_id=50)
    ),
    "a content header with weight 1": lambda s: (
        publish_method(1, "", s.name()) + header(1, 3, weight=1) + body(1, b"abc")
    ),
    "a content header too short": lambda s: (
        publish_method(1, "", s.name()) + frame(codec.FRAME_HEADER, 1, b"\x00\x3c\x00")
    ),
    "a method between publish and its header": lambda s: (
        publish_method(1, "", s.name()) + method_frame(1, m.BasicQos(prefetch_count=1))
    ),
    "a method between content header and body": lambda s: (
        publish_method(1, "", s.name()) + header(1, 3) + method_frame(1, m.BasicQos())
    ),
    "a publish between content header and body": lambda s: (
        publish_method(1, "", s.name()) + header(1, 3) + publish_method(1, "", s.name())
    ),
    "an unknown method id": lambda s: frame(codec.FRAME_METHOD, 1, struct.pack(">HH", 60, 999)),
    "an unknown class id": lambda s: frame(codec.FRAME_METHOD, 1, struct.pack(">HHB", 99, 10, 0)),
    "a method payload of 3 bytes": lambda s: frame(codec.FRAME_METHOD, 1, b"\x00\x32\x00"),
    "a truncated queue.declare": lambda s: frame(
        codec.FRAME_METHOD, 1, method_payload(m.QueueDeclare(queue=s.name()))[:-3]
    ),
    "a queue.declare with trailing bytes": lambda s: frame(
        codec.FRAME_METHOD, 1, method_payload(m.QueueDeclare(queue=s.name())) + b"\x00\x00"
    ),
    "a field table with an unknown type tag": lambda s: frame(
        codec.FRAME_METHOD,
        1,
        method_payload(m.QueueDeclare(queue=s.name(), arguments={}))[:-4]
        + struct.pack(">I", 5)
        + b"\x01aZ\x00\x00",
    ),
    "a field table longer than its method": lambda s: frame(
        codec.FRAME_METHOD,
        1,
        method_payload(m.QueueDeclare(queue=s.name(), arguments={}))[:-4] + struct.pack(">I", 99),
    ),
}

for _label, _make in _MALFORMED.items():
    scenario(f"frames: {_label}")(_connection_error(_make, _label != "a bad frame-end octet"))


@scenario("frames: a publish with a body-less header frame is stored empty")
def _empty_body(s: Session) -> None:
    c = queue_ready(s)
    c.client.send_raw(publish_method(1, "", s.name()) + header(1, 0))
    c.sync(1)
    get_one(c, s)


@scenario("frames: a body larger than its header announced")
def _body_too_large(s: Session) -> None:
    # RabbitMQ 3.10 never answers (allowlist.py): `quiet`, not a wait for the close.
    c = queue_ready(s)
    c.client.send_raw(publish_method(1, "", s.name()) + header(1, 3) + body(1, b"abcde"))
    c.quiet()
