"""Content: basic properties round-trip and agree with pamqp; content headers keep the
raw property bytes; encode_deliver writes the same frames as the generic path and as
pamqp, splitting bodies at frame_max - 8."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from amqp_gateway.codec import encode_deliver
from amqp_gateway.codec.basic import append_basic_ack, read_basic_publish
from amqp_gateway.codec.content import (
    ContentHeader,
    append_body_frames,
    append_content_header_frame,
    decode_content_header,
)
from amqp_gateway.codec.frame import FRAME_BODY, FRAME_HEADER, FRAME_METHOD, Frame, split_frames
from amqp_gateway.codec.ids import ChannelId, DeliveryTag
from amqp_gateway.codec.method_frame import (
    append_content_frames,
    append_method_frame,
    decode_method,
)
from amqp_gateway.codec.methods import (
    BasicAck,
    BasicDeliver,
    BasicGetOk,
    BasicPublish,
    QueueDeclare,
)
from amqp_gateway.codec.properties import (
    EMPTY_PROPERTIES_RAW,
    BasicProperties,
    add_long_header,
    decode_properties,
    encode_properties,
)
from amqp_gateway.codec.spec import BASIC_PROPERTIES
from amqp_gateway.errors import AMQPSyntaxError, FrameError

from .strategies import (
    basic_properties,
    pamqp_basic_properties,
    pamqp_decodable_properties,
    pamqp_properties,
    to_pamqp,
    typed,
)

CHANNEL = ChannelId(2)
# Properties carry recursive header tables, the slowest strategy; 50 examples suffice here
# because test_values.py covers tables in depth.
with_tables = settings(max_examples=50)


def test_properties_follow_the_spec_order() -> None:
    assert [f.name for f in BasicProperties.__dataclass_fields__.values()] == [
        p.name for p in BASIC_PROPERTIES
    ]


@with_tables
@given(basic_properties)
def test_properties_round_trip(properties: BasicProperties) -> None:
    raw = encode_properties(properties)
    decoded = decode_properties(raw)
    assert decoded == properties
    assert typed(decoded.headers) == typed(properties.headers)
    assert encode_properties(decoded) == raw


def test_property_flags_and_layout() -> None:
    assert encode_properties(BasicProperties()) == EMPTY_PROPERTIES_RAW == b"\x00\x00"
    raw = encode_properties(BasicProperties(content_type="a", delivery_mode=2, cluster_id="c"))
    assert raw == struct.pack(">H", 1 << 15 | 1 << 12 | 1 << 2) + b"\x01a" + b"\x02" + b"\x01c"


def test_the_two_low_flag_bits_are_ignored_like_rabbitmq() -> None:
    assert decode_properties(b"\x80\x03\x01a") == BasicProperties(content_type="a")


@with_tables
@given(pamqp_decodable_properties)
def test_pamqp_decodes_the_properties_we_encode(properties: BasicProperties) -> None:
    header = pamqp_header.ContentHeader()
    header.unmarshal(b"\x00\x3c\x00\x00" + struct.pack(">Q", 0) + encode_properties(properties))
    decoded = header.properties
    for name in BasicProperties.__dataclass_fields__:
        ours = getattr(properties, name)
        theirs = getattr(decoded, "message_type" if name == "type" else name)
        if name == "timestamp" and theirs is not None:
            theirs = int(theirs.timestamp())
        if name == "cluster_id" and theirs == "" and ours is None:
            theirs = None  # pamqp's default for an absent cluster_id
        assert theirs == (to_pamqp(ours) if name == "headers" else ours), name


@with_tables
@given(pamqp_basic_properties)
def test_we_decode_the_properties_pamqp_encodes(properties: BasicProperties) -> None:
    assert decode_properties(pamqp_properties(properties).marshal()) == properties


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"", "malformed"),
        (b"\x80", "malformed"),
        (b"\x80\x00", "malformed"),
        (b"\x80\x00\x05ab", "shortstr runs past"),
        (b"\x00\x40\x00\x00", "malformed"),  # timestamp truncated
        (b"\x20\x00\x00\x00\x00\x01\x01kZ", "unknown field value type"),
        (b"\x00\x00\x00", "1 bytes after"),
    ],
)
def test_malformed_properties_are_syntax_errors(raw: bytes, match: str) -> None:
    with pytest.raises(AMQPSyntaxError, match=match):
        decode_properties(raw)


@with_tables
@given(basic_properties, st.integers(0, 2**64 - 1))
def test_content_header_keeps_the_raw_properties(
    properties: BasicProperties, body_size: int
) -> None:
    raw = encode_properties(properties)
    out = bytearray()
    append_content_header_frame(out, CHANNEL, body_size, raw, 1 << 20)
    frames, _ = split_frames(out, 1 << 20)
    assert [(f.frame_type, f.channel) for f in frames] == [(FRAME_HEADER, CHANNEL)]
    assert decode_content_header(frames[0].payload) == ContentHeader(60, 0, body_size, raw)


def test_a_truncated_content_header_is_a_frame_error() -> None:
    # RabbitMQ's text, as for any frame it cannot analyze (rabbit_command_assembler).
    expected = "type 2, all octets = <<0,60,0,0,0,0,0,0,0,0,0,0,0>>: unknown_frame"
    with pytest.raises(FrameError, match=expected):
        decode_content_header(b"\x00\x3c" + b"\x00" * 11)
    header = decode_content_header(b"\x00\x3c\x00\x01" + b"\x00" * 10)
    assert header == ContentHeader(60, 1, 0, b"\x00\x00")


def test_properties_that_do_not_fit_a_frame_are_refused() -> None:
    raw = encode_properties(BasicProperties(headers={"k": "v" * 5000}))
    with pytest.raises(ValueError, match="exceeds frame_max 4096"):
        append_content_header_frame(bytearray(), CHANNEL, 0, raw, 4096)
    out = bytearray(b"keep")
    with pytest.raises(ValueError, match="exceeds frame_max"):
        encode_deliver(out, CHANNEL, "c", DeliveryTag(1), False, "e", "r", raw, b"", 4096)
    assert out == b"keep"
    with pytest.raises(ValueError, match="exceeds 255"):
        encode_deliver(out, CHANNEL, "c" * 256, DeliveryTag(1), False, "e", "r", raw, b"", 4096)
    assert out == b"keep"
    with pytest.raises(ValueError, match="delivery tag"):
        encode_deliver(out, CHANNEL, "c", DeliveryTag(2**64), False, "e", "r", b"\0\0", b"", 4096)
    with pytest.raises(ValueError, match="cannot encode"):
        append_basic_ack(out, ChannelId(70000), DeliveryTag(1), False)
    with pytest.raises(ValueError, match="out of range"):
        append_body_frames(out, ChannelId(-1), b"x", 4096)
    assert out == b"keep"


def bodies(frames: list[Frame]) -> list[bytes]:
    return [f.payload for f in frames if f.frame_type == FRAME_BODY]


@pytest.mark.parametrize("size", [0, 1, 4087, 4088, 4089, 8176, 8177, 20000])
def test_bodies_split_into_frames_of_at_most_frame_max_minus_8(size: int) -> None:
    body = bytes(range(256)) * (size // 256 + 1)
    body = body[:size]
    out = bytearray()
    append_body_frames(out, CHANNEL, body, 4096)
    frames, consumed = split_frames(out, 4096)
    assert consumed == len(out)
    pieces = bodies(frames)
    assert b"".join(pieces) == body
    assert len(pieces) == -(-size // 4088)
    assert all(len(p) == 4088 for p in pieces[:-1])


@with_tables
@given(
    consumer_tag=st.text(max_size=40),
    delivery_tag=st.integers(0, 2**64 - 1),
    redelivered=st.booleans(),
    exchange=st.text(max_size=40),
    routing_key=st.text(max_size=40),
    properties=basic_properties,
    body=st.binary(max_size=3000),
    frame_max=st.integers(4096 - 2000, 4096).map(lambda n: max(n, 1200)),
)
def test_encode_deliver_writes_what_the_generic_path_writes(
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    properties: BasicProperties,
    body: bytes,
    frame_max: int,
) -> None:
    raw = encode_properties(properties)
    if 12 + len(raw) > frame_max - 8:
        return
    fast = bytearray(b"earlier frames")
    tag = DeliveryTag(delivery_tag)
    encode_deliver(
        fast, CHANNEL, consumer_tag, tag, redelivered, exchange, routing_key, raw, body, frame_max
    )
    generic = bytearray(b"earlier frames")
    deliver = BasicDeliver(consumer_tag, tag, redelivered, exchange, routing_key)
    append_content_frames(generic, CHANNEL, deliver, raw, body, frame_max)
    assert fast == generic
    frames, _ = split_frames(fast[len(b"earlier frames") :], frame_max)
    assert decode_method(frames[0].payload) == deliver
    assert decode_content_header(frames[1].payload) == ContentHeader(60, 0, len(body), raw)
    assert b"".join(bodies(frames)) == body


def test_encode_deliver_accepts_pre_encoded_names() -> None:
    tag = DeliveryTag(7)
    as_text, as_bytes = bytearray(), bytearray()
    encode_deliver(as_text, CHANNEL, "ctag", tag, True, "é", "rk", b"\x00\x00", b"hi", 4096)
    encode_deliver(as_bytes, CHANNEL, b"ctag", tag, True, "é".encode(), b"rk", b"\0\0", b"hi", 4096)
    assert as_text == as_bytes


def test_pamqp_reads_a_delivery_frame_by_frame() -> None:
    raw = encode_properties(
        BasicProperties(content_type="text/plain", headers={"n": 1}, delivery_mode=2)
    )
    body = b"b" * 5000
    out = bytearray()
    encode_deliver(out, CHANNEL, "ctag", DeliveryTag(42), True, "amq.topic", "a.b", raw, body, 4096)
    data = bytes(out)
    consumed, channel, deliver = pamqp_frame.unmarshal(data)
    assert channel == 2
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == ("ctag", 42, True)
    assert (deliver.exchange, deliver.routing_key) == ("amq.topic", "a.b")
    data = data[consumed:]
    consumed, _, header = pamqp_frame.unmarshal(data)
    assert header.body_size == 5000
    assert header.properties.content_type == "text/plain"
    assert header.properties.headers == {"n": 1}
    data = data[consumed:]
    received = b""
    while data:
        consumed, _, piece = pamqp_frame.unmarshal(data)
        received += piece.value
        data = data[consumed:]
    assert received == body


def test_we_read_a_publish_that_pamqp_writes() -> None:
    wire = b"".join(
        [
            pamqp_frame.marshal(
                commands.Basic.Publish(exchange="ex", routing_key="rk", mandatory=True), 1
            ),
            pamqp_frame.marshal(
                pamqp_header.ContentHeader(0, 3, commands.Basic.Properties(app_id="app")), 1
            ),
            pamqp_frame.marshal(pamqp_body.ContentBody(b"abc"), 1),
        ]
    )
    frames, consumed = split_frames(wire, 4096)
    assert consumed == len(wire)
    assert [f.frame_type for f in frames] == [FRAME_METHOD, FRAME_HEADER, FRAME_BODY]
    assert read_basic_publish(frames[0].payload) == ("ex", "rk", True, False)
    assert decode_method(frames[0].payload) == BasicPublish(0, "ex", "rk", True, False)
    header = decode_content_header(frames[1].payload)
    assert header.body_size == 3
    assert decode_properties(header.properties_raw) == BasicProperties(app_id="app")
    assert frames[2].payload == b"abc"


def test_append_basic_ack_matches_the_generic_encoder() -> None:
    fast = bytearray()
    append_basic_ack(fast, CHANNEL, DeliveryTag(2**64 - 1), True)
    generic = bytearray()
    append_method_frame(generic, CHANNEL, BasicAck(DeliveryTag(2**64 - 1), True))
    assert fast == generic


def test_content_frames_refuse_methods_without_content() -> None:
    with pytest.raises(AssertionError, match="carries no content"):
        append_content_frames(bytearray(), CHANNEL, QueueDeclare(), b"\x00\x00", b"", 4096)
    out = bytearray()
    append_content_frames(out, CHANNEL, BasicGetOk(DeliveryTag(1)), b"\x00\x00", b"", 4096)
    frames, _ = split_frames(out, 4096)
    assert [f.frame_type for f in frames] == [FRAME_METHOD, FRAME_HEADER]


@given(basic_properties)
def test_adding_a_long_header_by_splicing_equals_decode_add_encode(
    properties: BasicProperties,
) -> None:
    if properties.headers and "x-stream-offset" in properties.headers:
        return
    raw = encode_properties(properties)
    spliced = add_long_header(raw, "x-stream-offset", 12345)
    headers = dict(properties.headers or {})
    headers["x-stream-offset"] = 12345
    assert decode_properties(spliced) == dataclasses.replace(properties, headers=headers)


def test_adding_a_header_to_truncated_properties_is_a_syntax_error() -> None:
    raw = encode_properties(BasicProperties(content_type="text/plain", headers={"a": 1}))
    with pytest.raises(AMQPSyntaxError, match="truncated"):
        add_long_header(raw[:-3], "x-stream-offset", 1)
