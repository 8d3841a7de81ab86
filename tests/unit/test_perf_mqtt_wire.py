"""`streamq perf mqtt`'s hot path (streamq/perf/mqtt_wire.py) checked against the
project's MQTT codec both ways: what `PublishBatch` and `pubacks` write decodes to the
packets meant, and `Incoming` reads what the codec encodes, fed whole or byte by byte."""

from __future__ import annotations

import pytest

from mqtt_gateway.codec import (
    ConnAck,
    Decoder,
    PingReq,
    PingResp,
    ProtocolLevel,
    PubAck,
    Publish,
    SubAck,
    encode,
)
from streamq.perf.errors import PerfError
from streamq.perf.mqtt_wire import PACKET_ID_MAX, Incoming, PublishBatch, body_pattern, pubacks

LEVEL = ProtocolLevel.MQTT_3_1_1


def decode_all(data: bytes | bytearray) -> list[object]:
    decoder = Decoder(protocol_level=LEVEL)
    packets: list[object] = decoder.feed(data)
    assert decoder.buffered == 0
    return packets


def test_qos1_batches_number_their_packets_in_turn_and_wrap() -> None:
    batch = PublishBatch("a/b", 5, 1, retain=False, random=False)
    batch.next_id = PACKET_ID_MAX - 1
    packets = decode_all(batch.take(3) + batch.take(2))
    assert [p.packet_id for p in packets] == [PACKET_ID_MAX - 1, PACKET_ID_MAX, 1, 2, 3]  # type: ignore[attr-defined]
    assert packets[0] == Publish("a/b", body_pattern(5), 1, False, False, PACKET_ID_MAX - 1)


def test_qos0_retained_and_random_bodies() -> None:
    batch = PublishBatch("t", 16, 0, retain=True, random=True)
    packets = decode_all(batch.take(4))
    assert all(isinstance(p, Publish) and p.retain and p.qos == 0 for p in packets)
    bodies = {p.payload for p in packets}  # type: ignore[attr-defined]
    assert len(bodies) == 4 and all(len(body) == 16 for body in bodies)


def test_a_bad_topic_is_a_perf_error() -> None:
    with pytest.raises(PerfError, match="cannot publish"):
        PublishBatch("a/+", 1, 0, retain=False, random=False)


def test_pubacks_decode_as_pubacks() -> None:
    assert decode_all(pubacks([1, 300, PACKET_ID_MAX])) == [
        PubAck(1),
        PubAck(300),
        PubAck(PACKET_ID_MAX),
    ]


def stream_from_broker() -> bytes:
    body = body_pattern(200)  # a two-byte remaining length
    packets = [
        ConnAck(0),
        SubAck(1, (1,)),
        Publish("x/y", body, 0),
        Publish("x/y", body, 1, packet_id=7),
        PubAck(9),
        PingReq(),
        PingResp(),
        Publish("x/y", b"other", 1, packet_id=8),
    ]
    return b"".join(encode(packet, LEVEL) for packet in packets)


@pytest.mark.parametrize("step", [1, 3, 1 << 20])
def test_incoming_counts_whatever_the_reads(step: int) -> None:
    data = stream_from_broker()
    incoming = Incoming(expected_body=body_pattern(200))
    for start in range(0, len(data), step):
        incoming.feed(data[start : start + step])
    assert incoming.publishes == 3
    assert incoming.packet_ids == [7, 8]
    assert (incoming.pubacks, incoming.pingreqs, incoming.bad_bodies) == (1, 1, 1)
    assert incoming.others == [ConnAck(0), SubAck(1, (1,))]


def test_incoming_refuses_what_no_broker_sends() -> None:
    with pytest.raises(PerfError, match="remaining length"):
        Incoming().feed(b"\x30\xff\xff\xff\xff\x01")
    with pytest.raises(PerfError, match="bad packet"):
        Incoming().feed(b"\x20\x01\x00")  # a CONNACK one byte short


def test_incoming_stops_at_the_allowed_publishes_and_keeps_the_rest() -> None:
    packet = encode(Publish("x", b"body", 1, packet_id=3), LEVEL)
    incoming = Incoming()
    incoming.feed(packet * 5, publishes_max=2)
    assert (incoming.publishes, incoming.buffered) == (2, 3 * len(packet))
    incoming.publishes = 0
    incoming.feed(b"", publishes_max=0)
    assert (incoming.publishes, incoming.buffered) == (0, 3 * len(packet))
    incoming.feed(b"")
    assert (incoming.publishes, incoming.buffered) == (3, 0)
