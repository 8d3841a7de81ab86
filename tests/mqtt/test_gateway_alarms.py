"""Resource alarms hold MQTT publishers, as RabbitMQ blocks them: while the broker is
over its memory or disk limit, a connection that has published is not read (its next
PUBLISH waits unacknowledged, and its keep-alive does not expire meanwhile); once the
alarm clears, the held publish is stored and acknowledged."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqtt_gateway.client_view import MqttClient
from mqtt_gateway.codec import ConnAck, Connect, ProtocolLevel, PubAck, Publish
from streamq.broker.resources import ResourceLimits
from tests.mqtt.clients import Paho, RawClient, eventually
from tests.mqtt.conftest import MqttBroker

TERABYTE = 1 << 40
HELD_S = 2.0  # past the publisher's 1 s keep-alive times 1.5


def alarm_of(running: MqttBroker) -> str:
    assert running.broker is not None
    clients = [c for c in running.broker.clients.values() if isinstance(c, MqttClient)]
    return clients[0]._session.gateway.alarm if clients else ""


def test_publishers_are_held_while_an_alarm_lasts(tmp_path: Path) -> None:
    running = MqttBroker(tmp_path / "data")
    try:
        assert running.broker is not None
        sub = Paho(running.mqtt_port, "sub")
        sub.connect()
        sub.subscribe("a/#", 1)
        level = ProtocolLevel.MQTT_3_1_1
        raw = RawClient(running.mqtt_port)
        raw.send(Connect(level, "pub", keep_alive_s=1, username="guest", password=b"guest"))
        assert raw.read() == ConnAck()
        raw.send(Publish("a/1", b"before", 1, packet_id=1))
        assert raw.read() == PubAck(1)
        assert [m.payload for m in sub.receive(1)] == [b"before"]
        running.broker.resources.limits = ResourceLimits(1, TERABYTE)  # memory and disk
        assert eventually(lambda: alarm_of(running) == "low on memory & disk")
        raw.send(Publish("a/2", b"held", 1, packet_id=2))
        with pytest.raises(TimeoutError):
            raw.read(timeout_s=HELD_S)
        running.broker.resources.limits = ResourceLimits(TERABYTE, 0)
        assert raw.read() == PubAck(2)
        assert [m.payload for m in sub.receive(1)] == [b"held"]
        raw.close()
        sub.disconnect()
    finally:
        running.stop()
