"""The specifications' own examples, byte for byte: Remaining Length encodings (3.1.1
table 2.4 / 5.0 table 1-1), the UTF-8 string example (5.0 figure 1-1), the CONNECT
variable header examples (3.1.1 figure 3.6, 5.0 figure 3-6) and the minimal packets."""

from __future__ import annotations

import pytest

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    ProtocolLevel,
    PubAck,
    encode,
)
from mqtt_gateway.codec.wire import Reader, read_varint, varint_bytes

V311, V5 = ProtocolLevel.MQTT_3_1_1, ProtocolLevel.MQTT_5


@pytest.mark.parametrize(
    ("value", "data"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
        (268_435_455, b"\xff\xff\xff\x7f"),
    ],
)
def test_remaining_length_table(value: int, data: bytes) -> None:
    assert varint_bytes(value) == data
    assert read_varint(memoryview(data), 0) == (value, len(data))
    assert read_varint(memoryview(data[:-1]), 0) is None  # incomplete, not an error


def test_utf8_example() -> None:
    data = b"\x00\x05\x41\xf0\xaa\x9b\x94"  # "A" then U+2A6D4, 5.0 section 1.5.4
    assert Reader(data).string("example") == "A\U0002a6d4"


def test_connect_variable_header_3_1_1() -> None:
    # 3.1.1 figure 3.6: "MQTT", level 4, flags 0xCE (user name, password, will QoS 1,
    # will, clean session), keep alive 10; our payload follows it.
    body = b"\x00\x04MQTT\x04\xce\x00\x0a" + b"\x00\x01c" + b"\x00\x01t\x00\x01m"
    body += b"\x00\x01u\x00\x01p"
    (packet,) = Decoder().feed(b"\x10" + bytes([len(body)]) + body)
    assert packet == Connect(
        V311, "c", True, 10, "u", b"p", will=_will("t", b"m", 1), properties=Properties()
    )


def test_connect_variable_header_5_0() -> None:
    # 5.0 figure 3-6: as above plus properties of length 5: Session Expiry Interval 10.
    body = b"\x00\x04MQTT\x05\xce\x00\x0a\x05\x11\x00\x00\x00\x0a" + b"\x00\x01c"
    body += b"\x00" + b"\x00\x01t\x00\x01m" + b"\x00\x01u\x00\x01p"
    (packet,) = Decoder().feed(b"\x10" + bytes([len(body)]) + body)
    assert isinstance(packet, Connect)
    assert packet.properties == Properties(session_expiry_interval_s=10)
    assert packet.keep_alive_s == 10 and packet.will == _will("t", b"m", 1)


def _will(topic: str, payload: bytes, qos: int) -> object:
    from mqtt_gateway.codec import Will  # noqa: PLC0415

    return Will(topic, payload, qos)


@pytest.mark.parametrize(
    ("packet", "level", "data"),
    [
        (PingReq(), V311, b"\xc0\x00"),
        (PingResp(), V5, b"\xd0\x00"),
        (Disconnect(), V311, b"\xe0\x00"),
        (Disconnect(), V5, b"\xe0\x00"),  # 5.0 3.14.2.1: reason 0, no properties: omitted
        (PubAck(7), V5, b"\x40\x02\x00\x07"),  # 5.0 3.4.2.1: the short form
        (PubAck(7, 0x10), V5, b"\x40\x03\x00\x07\x10"),
        (ConnAck(0, True), V311, b"\x20\x02\x01\x00"),
        (ConnAck(0), V5, b"\x20\x03\x00\x00\x00"),
    ],
)
def test_minimal_packets(packet: object, level: ProtocolLevel, data: bytes) -> None:
    assert encode(packet, level) == data  # type: ignore[arg-type]  # one of the Packet union
    assert Decoder(level).feed(data) == [packet]
