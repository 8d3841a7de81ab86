"""Bytes the MQTT gateway refuses, answered as each level says (the codec's errors in
the session, mqtt_gateway/session.py `_refuse_bytes`): a CONNACK code while the CONNECT
is read, a 5.0 DISCONNECT with the reason code after, else just a close."""

from __future__ import annotations

from pathlib import Path

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    Properties,
    ProtocolLevel,
    Publish,
    ReasonCode,
    encode,
)
from tests.mqtt.clients import RawClient
from tests.mqtt.conftest import MqttBroker

V311, V5 = ProtocolLevel.MQTT_3_1_1, ProtocolLevel.MQTT_5


def test_an_unknown_protocol_level_gets_connack_1(mqtt_broker: MqttBroker) -> None:
    connect = bytearray(encode(Connect(V311, "x", username="guest", password=b"guest"), V311))
    connect[8] = 6  # the protocol level byte after "\x00\x04MQTT"
    raw = RawClient(mqtt_broker.mqtt_port)
    raw.send_bytes(bytes(connect))
    assert raw.read() == ConnAck(1)
    assert raw.closed_by_peer()


def test_an_authentication_method_gets_connack_0x8c(mqtt_broker: MqttBroker) -> None:
    """MQTT 5's enhanced authentication: no method is offered (MQTT-4.12.0-1), even
    with a valid user name and password beside it."""
    auth = Properties(authentication_method="SCRAM-SHA-1", authentication_data=b"\x01")
    raw = RawClient(mqtt_broker.mqtt_port, V5)
    raw.send(Connect(V5, "scram", username="guest", password=b"guest", properties=auth))
    assert raw.read() == ConnAck(ReasonCode.BAD_AUTHENTICATION_METHOD)
    assert raw.closed_by_peer()


def test_a_packet_before_connect_closes(mqtt_broker: MqttBroker) -> None:
    raw = RawClient(mqtt_broker.mqtt_port)
    raw.send(PingReq())
    assert raw.closed_by_peer()


def test_a_packet_past_the_maximum_size_is_refused(tmp_path: Path) -> None:
    running = MqttBroker(tmp_path / "data", mqtt_max_packet_size=1024)
    try:
        v5 = RawClient(running.mqtt_port, V5)
        v5.send(Connect(V5, "big5", username="guest", password=b"guest"))
        connack = v5.read()
        assert isinstance(connack, ConnAck) and connack.properties.maximum_packet_size == 1024
        v5.send(Publish("t", b"x" * 2000, 0))
        assert v5.read() == Disconnect(ReasonCode.PACKET_TOO_LARGE)
        assert v5.closed_by_peer()
        v3 = RawClient(running.mqtt_port)
        v3.send(Connect(V311, "big3", username="guest", password=b"guest"))
        assert v3.read() == ConnAck()
        v3.send(Publish("t", b"x" * 2000, 0))
        assert v3.closed_by_peer()  # 3.1.1: no DISCONNECT from the server
    finally:
        running.stop()


def test_malformed_bytes_after_connect(mqtt_broker: MqttBroker) -> None:
    v5 = RawClient(mqtt_broker.mqtt_port, V5)
    v5.send(Connect(V5, "bad5", username="guest", password=b"guest"))
    assert isinstance(v5.read(), ConnAck)
    v5.send_bytes(b"\xc0\x01\x00")  # PINGREQ with a body
    assert v5.read() == Disconnect(ReasonCode.MALFORMED_PACKET)
    assert v5.closed_by_peer()
