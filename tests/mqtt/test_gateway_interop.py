"""MQTT and AMQP on one broker: pika publishers to amq.topic reach paho subscribers, paho
publishers reach AMQP queues (and streams) bound to amq.topic, with RabbitMQ's headers;
and a QoS 1 PUBACK means the message is on disk (a SIGKILL right after it loses none)."""

from __future__ import annotations

import re
from pathlib import Path

import pika

from tests.integration.broker_process import BrokerProcess
from tests.mqtt.clients import Paho
from tests.mqtt.conftest import MqttBroker


def amqp_channel(port: int) -> pika.adapters.blocking_connection.BlockingChannel:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    return connection.channel()


def test_amqp_publishers_reach_mqtt_subscribers(mqtt_broker: MqttBroker) -> None:
    sub = Paho(mqtt_broker.mqtt_port, "sub")
    sub.connect()
    sub.subscribe("sensors/+/temp", 1)
    channel = amqp_channel(mqtt_broker.amqp_port)
    channel.basic_publish("amq.topic", "sensors.kitchen.temp", b"21")
    channel.basic_publish("amq.topic", "sensors.kitchen.humidity", b"40")
    channel.basic_publish("amq.topic", "sensors.*.temp", b"not a topic name")  # dropped
    channel.basic_publish("amq.topic", "sensors.hall.temp", b"19")
    got = sub.receive(2)
    # no x-mqtt-publish-qos header: delivered at the subscription's QoS
    assert [(m.topic, m.payload, m.qos) for m in got] == [
        ("sensors/kitchen/temp", b"21", 1),
        ("sensors/hall/temp", b"19", 1),
    ]
    assert sub.nothing_more()
    channel.connection.close()


def test_mqtt_publishers_reach_amqp_queues_and_streams(mqtt_broker: MqttBroker) -> None:
    channel = amqp_channel(mqtt_broker.amqp_port)
    channel.queue_declare("work", durable=True)
    channel.queue_bind("work", "amq.topic", "orders.#")
    channel.queue_declare("feed", durable=True, arguments={"x-queue-type": "stream"})
    channel.queue_bind("feed", "amq.topic", "orders.*")
    pub = Paho(mqtt_broker.mqtt_port, "pub")
    pub.connect()
    pub.publish("orders/eu", b"one", 1)
    pub.publish("orders/eu/late", b"two", 0)
    pub.publish("other", b"none", 1)
    bodies = []
    for _ in range(2):
        method, properties, body = channel.basic_get("work", auto_ack=True)
        assert method is not None
        bodies.append((method.routing_key, body, properties.delivery_mode, properties.headers))
    assert bodies == [
        ("orders.eu", b"one", 2, {"x-mqtt-publish-qos": 1, "x-mqtt-dup": False}),
        ("orders.eu.late", b"two", 1, {"x-mqtt-publish-qos": 0, "x-mqtt-dup": False}),
    ]
    assert channel.basic_get("work", auto_ack=True)[0] is None
    # The stream holds the feed: replayable from the first offset.
    channel.basic_qos(prefetch_count=10)
    got: list[bytes] = []
    channel.basic_consume(
        "feed",
        lambda ch, method, _p, body: got.append(body),
        arguments={"x-stream-offset": "first"},
    )
    channel.connection.process_data_events(time_limit=2)
    assert got == [b"one"]
    channel.connection.close()


def test_a_puback_means_the_message_is_on_disk(tmp_path: Path) -> None:
    """Publish QoS 1 into a durable AMQP queue, SIGKILL the broker at once after the
    PUBACKs: every acknowledged message is there after the restart."""
    data = tmp_path / "data"
    broker = BrokerProcess(data, "--mqtt-port", "0")
    mqtt_port = _mqtt_port(broker.stderr)
    channel = amqp_channel(broker.amqp_port)
    channel.queue_declare("kept", durable=True)
    channel.queue_bind("kept", "amq.topic", "k")
    channel.connection.close()
    pub = Paho(mqtt_port, "pub")
    pub.connect()
    for n in range(50):
        pub.publish("k", str(n).encode(), 1)
    broker.kill()
    pub.stop()
    broker = BrokerProcess(data)
    try:
        channel = amqp_channel(broker.amqp_port)
        assert channel.queue_declare("kept", durable=True, passive=True).method.message_count == 50
        channel.connection.close()
    finally:
        broker.stop()


def _mqtt_port(stderr: bytes) -> int:
    match = re.search(rb" mqtt=127\.0\.0\.1:(\d+)", stderr)
    assert match is not None, stderr
    return int(match[1])
