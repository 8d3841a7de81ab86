"""The receive loop's fast path: a whole basic.publish read in one call, or None.

`read_publish` must agree with the frame-by-frame path on every message it accepts and
decline (None, never an exception) whatever it does not handle: partial input, bodies
split over several frames, frames of another kind or channel, malformed fields.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.codec.frame import received_payload_max

FRAME_MAX = 4096
PAYLOAD_MAX = received_payload_max(FRAME_MAX)  # what the connection passes: FRAME_MAX


def publish(
    body: bytes,
    channel: int = 1,
    exchange: str = "amq.direct",
    routing_key: str = "rk",
    mandatory: bool = False,
    properties: codec.BasicProperties | None = None,
) -> bytes:
    out = bytearray()
    method = m.BasicPublish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)
    raw = codec.encode_properties(properties or codec.BasicProperties())
    codec.append_content_frames(out, codec.ChannelId(channel), method, raw, body, FRAME_MAX)
    return bytes(out)


@given(
    body=st.binary(max_size=PAYLOAD_MAX),
    exchange=st.text(max_size=20),
    routing_key=st.text(max_size=40),
    mandatory=st.booleans(),
    channel=st.integers(1, 2047),
)
def test_whole_publishes_are_read_with_every_field(
    body: bytes, exchange: str, routing_key: str, mandatory: bool, channel: int
) -> None:
    properties = codec.BasicProperties(content_type="text/plain", delivery_mode=2)
    data = b"\x08" + publish(body, channel, exchange, routing_key, mandatory, properties)
    message = codec.read_publish(data, 1, PAYLOAD_MAX)
    assert message is not None
    assert message.channel == channel
    assert (message.exchange, message.routing_key) == (exchange, routing_key)
    assert message.bits == int(mandatory)
    assert codec.decode_properties(message.properties_raw) == properties
    assert message.body == body
    assert message.end == len(data)


def test_every_truncation_is_declined() -> None:
    data = publish(b"hello world")
    for cut in range(len(data)):
        assert codec.read_publish(data[:cut], 0, PAYLOAD_MAX) is None


def test_a_body_split_over_frames_is_left_to_the_frame_path() -> None:
    data = publish(b"z" * (PAYLOAD_MAX + 1))
    assert codec.read_publish(data, 0, PAYLOAD_MAX) is None


@pytest.mark.parametrize(
    ("position", "value"),
    [
        (0, 2),  # not a method frame
        (8, 50),  # class 50, not basic
        (10, 41),  # method 41, not publish
        (6, 3),  # a method frame size that does not end at a frame-end octet
    ],
)
def test_other_frames_are_declined(position: int, value: int) -> None:
    data = bytearray(publish(b"body"))
    data[position] = value
    assert codec.read_publish(bytes(data), 0, PAYLOAD_MAX) is None


def test_a_content_header_with_a_nonzero_weight_is_declined_by_both_fast_paths() -> None:
    """Weight must be 0 (spec 4.2.6.1); the frame path reports it as RabbitMQ does."""
    data = bytearray(publish(b"body"))
    header = 7 + int.from_bytes(data[3:7], "big") + 1
    assert codec.read_publish(bytes(data), 0, PAYLOAD_MAX) is not None
    data[header + 7 + 3] = 1  # the low octet of the weight
    assert codec.read_publish(bytes(data), 0, PAYLOAD_MAX) is None
    assert codec.scan_publishes(bytes(data), 0, PAYLOAD_MAX, 1 << 30, 10)[2] == []


def test_content_on_another_channel_or_a_bad_frame_end_is_declined() -> None:
    one = publish(b"body", channel=1)
    two = publish(b"body", channel=2)
    method_end = 7 + int.from_bytes(one[3:7], "big") + 1
    mixed = one[:method_end] + two[method_end:]
    assert codec.read_publish(mixed, 0, PAYLOAD_MAX) is None
    broken = bytearray(one)
    broken[-1] = 0
    assert codec.read_publish(bytes(broken), 0, PAYLOAD_MAX) is None
    bad_utf8 = bytearray(publish(b"", exchange="ab"))
    bad_utf8[15] = 0xFF  # inside the exchange name
    assert codec.read_publish(bytes(bad_utf8), 0, PAYLOAD_MAX) is None


def test_a_body_frame_over_payload_max_is_declined() -> None:
    # A body frame is a frame like any other: over frame_max it is a FRAME_ERROR that
    # only the frame path reports, even when its size matches the header's body-size.
    data = publish(b"z" * 100)
    assert codec.read_publish(data, 0, 100) is not None
    assert codec.read_publish(data, 0, 99) is None


@pytest.mark.parametrize(
    ("size", "after_envelope"),
    [
        (2, b"\x00\x3c\xce" + bytes(9)),  # the frame ends where the weight would be
        (12, b"\x00\x3c\x00\x00" + bytes(8) + b"\xce"),  # no property flag word
        (13, b"\x00\x3c\x00\x00" + bytes(9) + b"\xce"),  # half a flag word
    ],
)
def test_a_content_header_without_property_flags_is_declined(
    size: int, after_envelope: bytes
) -> None:
    # decode_content_header raises FrameError below 14 payload bytes; the fast path must
    # not accept such a header, nor read its fixed fields past its frame-end octet.
    method_frame = publish(b"")[: 7 + 9 + len("amq.direct") + len("rk") + 1]
    header = b"\x02\x00\x01" + size.to_bytes(4, "big") + after_envelope
    assert codec.read_publish(method_frame + header, 0, PAYLOAD_MAX) is None
