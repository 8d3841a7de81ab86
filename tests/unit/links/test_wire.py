"""The client's frame scanner (`streamq.links.amqp.wire.scan`) over bytes the broker's own
encoder writes (`codec.encode_deliver`): whole runs, the same events fed one byte at a
time, content split over frames and reads, confirms, and malformed input refused."""

from __future__ import annotations

import pytest

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.errors import FrameError, UnexpectedFrame
from streamq.links.amqp.wire import (
    Assembly,
    Confirm,
    Delivery,
    DeliveryRun,
    Event,
    MethodFrame,
    PublishWriter,
    Returned,
    scan,
)

FRAME_MAX = 4096
PROPS = codec.encode_properties(codec.BasicProperties(delivery_mode=2, headers={"a": 1}))


def deliver(
    out: bytearray, tag: int, body: bytes, *, channel: int = 1, consumer: str = "c"
) -> None:
    codec.encode_deliver(
        out,
        codec.ChannelId(channel),
        consumer,
        codec.DeliveryTag(tag),
        tag % 2 == 0,
        "ex",
        f"key.{tag}",
        PROPS,
        body,
        FRAME_MAX,
    )


def sample() -> bytearray:
    out = bytearray()
    for tag in range(1, 6):
        deliver(out, tag, b"x" * tag)
    deliver(out, 6, b"big" * 3000)  # three body frames
    deliver(out, 7, b"")  # no body frame
    codec.append_method_frame(out, codec.ChannelId(1), m.BasicAck(codec.DeliveryTag(9), True))
    deliver(out, 8, b"other channel", channel=2)
    deliver(out, 9, b"other consumer", consumer="d")
    codec.append_method_frame(out, codec.ChannelId(1), m.BasicQosOk())
    out += codec.HEARTBEAT_FRAME
    return out


def flatten(events: list[Event]) -> list[object]:
    flat: list[object] = []
    for event in events:
        if isinstance(event, DeliveryRun):
            flat.extend((event.channel, event.consumer_tag, d) for d in event.deliveries)
        else:
            flat.append(event)
    return flat


def scan_all(data: bytearray, step: int) -> list[object]:
    """Scan `data` as if it arrived `step` bytes per read."""
    assembly, buffer, events = Assembly(), bytearray(), []
    position = 0
    for start in range(0, len(data), step):
        buffer += data[start : start + step]
        found, position = scan(buffer, position, len(buffer), FRAME_MAX, assembly)
        events.extend(flatten(found))
    assert position == len(buffer)
    return events


def test_whole_buffer_and_byte_by_byte_agree() -> None:
    data = sample()
    whole = scan_all(data, len(data))
    assert scan_all(data, 1) == whole
    assert scan_all(data, 7) == whole
    deliveries = [e for e in whole if type(e) is tuple]
    assert [d[2].delivery_tag for d in deliveries] == list(range(1, 10))  # type: ignore[union-attr]
    big = deliveries[5][2]
    assert isinstance(big, Delivery) and big.body == b"big" * 3000
    assert big.properties == PROPS and big.exchange == "ex" and big.routing_key == "key.6"
    assert deliveries[6][2].body == b""  # type: ignore[union-attr]
    assert deliveries[7][0] == 2 and deliveries[8][1] == "d"
    assert Confirm(1, 9, True, True) in whole
    assert MethodFrame(1, codec.encode_method_payload(m.BasicQosOk())) in whole


def test_one_run_per_consumer_in_a_read() -> None:
    out = bytearray()
    for tag in range(1, 101):
        deliver(out, tag, b"m")
    events, position = scan(out, 0, len(out), FRAME_MAX, Assembly())
    assert position == len(out)
    assert len(events) == 1 and isinstance(events[0], DeliveryRun)
    assert len(events[0].deliveries) == 100


def test_a_returned_message() -> None:
    out = bytearray()
    returned = m.BasicReturn(312, "NO_ROUTE", "ex", "nowhere")
    codec.append_content_frames(out, codec.ChannelId(1), returned, PROPS, b"body", FRAME_MAX)
    events, _ = scan(out, 0, len(out), FRAME_MAX, Assembly())
    assert events == [Returned(1, returned, PROPS, b"body")]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (bytearray(b"\x01\x00\x01\x00\x00\x10\x00" + bytes(4097)), FrameError),  # too large
        (bytearray(b"\x08\x00\x00\x00\x00\x00\x00\x00"), FrameError),  # no frame-end
        (bytearray(b"\x03\x00\x01\x00\x00\x00\x01x\xce"), UnexpectedFrame),  # body, no method
        (bytearray(b"\x08\x00\x01\x00\x00\x00\x00\xce"), UnexpectedFrame),  # heartbeat on 1
    ],
)
def test_malformed_input_is_refused(data: bytearray, error: type[Exception]) -> None:
    with pytest.raises(error):
        scan(data, 0, len(data), FRAME_MAX, Assembly())


def test_a_method_in_the_middle_of_content_is_refused() -> None:
    out = bytearray()
    deliver(out, 1, b"y" * 5000)
    last_frame_bytes = 5000 - (FRAME_MAX - 8) + 8
    cut = bytearray(out[: len(out) - last_frame_bytes])  # the last body frame is missing
    codec.append_method_frame(cut, codec.ChannelId(1), m.BasicQosOk())
    with pytest.raises(UnexpectedFrame):
        scan_all(cut, len(cut))


def test_publishes_are_what_the_codec_writes() -> None:
    writer = PublishWriter(FRAME_MAX)
    out = bytearray()
    body = b"z" * 9000
    writer.append(out, 3, "ex", "rk", PROPS, body, True)
    writer.append(out, 3, "ex", "rk", PROPS, b"", True)
    expected = bytearray()
    publish = m.BasicPublish(exchange="ex", routing_key="rk", mandatory=True)
    codec.append_content_frames(expected, codec.ChannelId(3), publish, PROPS, body, FRAME_MAX)
    codec.append_content_frames(expected, codec.ChannelId(3), publish, PROPS, b"", FRAME_MAX)
    assert out == expected
