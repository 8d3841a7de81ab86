"""QoS 2 publishes through the MQTT gateway: exactly once, across a client crash
between PUBREC and PUBREL and a broker restart there, for a persistent session.

Method: a raw client publishes QoS 2 into a durable AMQP queue bound to amq.topic, gets
PUBREC, and goes away without PUBREL; the broker restarts; the client reconnects and
resends the PUBLISH with DUP (MQTT-4.3.3), gets PUBREC again, sends PUBREL, gets
PUBCOMP. The queue holds the message once. After that, a new publish with the same packet
identifier, across another restart, is stored: the released identifier is not held."""

from __future__ import annotations

from pathlib import Path

import pika

from mqtt_gateway.codec import ConnAck, Connect, ProtocolLevel, PubComp, Publish, PubRec, PubRel
from tests.mqtt.clients import RawClient
from tests.mqtt.conftest import MqttBroker

V311 = ProtocolLevel.MQTT_3_1_1
HELLO = Connect(V311, "exactly-once", False, username="guest", password=b"guest")


def bodies(broker: MqttBroker) -> list[bytes]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    channel = connection.channel()
    got = []
    while True:
        method, _properties, body = channel.basic_get("orders", auto_ack=False)
        if method is None:
            break
        got.append(body)
    connection.close()  # unacked: back to the queue
    return got


def test_exactly_once_across_a_crash_and_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    running = MqttBroker(data)
    try:
        connection = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", running.amqp_port)
        )
        channel = connection.channel()
        channel.queue_declare("orders", durable=True)
        channel.queue_bind("orders", "amq.topic", "orders")
        connection.close()
        raw = RawClient(running.mqtt_port)
        raw.send(HELLO)
        assert raw.read() == ConnAck()
        raw.send(Publish("orders", b"once", 2, packet_id=9))
        assert raw.read() == PubRec(9)
        raw.close()  # the client crashes before PUBREL
    finally:
        running.stop()
    running = MqttBroker(data)
    try:
        raw = RawClient(running.mqtt_port)
        raw.send(HELLO)
        assert raw.read() == ConnAck(session_present=False)  # no subscription queue
        raw.send(Publish("orders", b"once", 2, dup=True, packet_id=9))
        assert raw.read() == PubRec(9)
        raw.send(PubRel(9))
        assert raw.read() == PubComp(9)
        assert bodies(running) == [b"once"]
        raw.close()
    finally:
        running.stop()
    running = MqttBroker(data)
    try:
        raw = RawClient(running.mqtt_port)
        raw.send(HELLO)
        assert isinstance(raw.read(), ConnAck)
        raw.send(Publish("orders", b"again", 2, packet_id=9))
        assert raw.read() == PubRec(9)
        raw.send(PubRel(9))
        assert raw.read() == PubComp(9)
        assert bodies(running) == [b"once", b"again"]
        raw.close()
    finally:
        running.stop()


def test_a_clean_start_forgets_the_identifiers(mqtt_broker: MqttBroker) -> None:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", mqtt_broker.amqp_port)
    )
    channel = connection.channel()
    channel.queue_declare("orders", durable=True)
    channel.queue_bind("orders", "amq.topic", "orders")
    connection.close()
    raw = RawClient(mqtt_broker.mqtt_port)
    raw.send(HELLO)
    assert raw.read() == ConnAck()
    raw.send(Publish("orders", b"first", 2, packet_id=3))
    assert raw.read() == PubRec(3)
    raw.close()
    clean = RawClient(mqtt_broker.mqtt_port)
    clean.send(Connect(V311, "exactly-once", True, username="guest", password=b"guest"))
    assert clean.read() == ConnAck()
    clean.close()
    raw = RawClient(mqtt_broker.mqtt_port)
    raw.send(HELLO)
    assert isinstance(raw.read(), ConnAck)
    raw.send(Publish("orders", b"second", 2, packet_id=3))  # a new message, not a resend
    assert raw.read() == PubRec(3)
    assert bodies(mqtt_broker) == [b"first", b"second"]
    raw.close()
