"""Publish and subscribe through the MQTT gateway with unmodified paho-mqtt, at each
protocol level: QoS 0 and 1 both ways, the delivered QoS the lower of the publish's and
the subscription's, wildcards mapped onto the topic exchange, the subscription queues
RabbitMQ names, `max_inflight_messages` as a prefetch, and the unix socket listener."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    ProtocolLevel,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.mqtt.clients import WAIT_S, Paho, RawClient, eventually
from tests.mqtt.conftest import MqttBroker


@pytest.mark.parametrize("version", ["3.1", "3.1.1", "5.0"])
def test_qos_0_and_1_reach_a_subscriber(mqtt_broker: MqttBroker, version: str) -> None:
    sub = Paho(mqtt_broker.mqtt_port, f"sub-{version}", version=version)
    pub = Paho(mqtt_broker.mqtt_port, f"pub-{version}", version=version)
    assert sub.connect() == (False, 0)
    assert pub.connect() == (False, 0)
    assert sub.subscribe("home/+/temperature", 1) == [1]
    pub.publish("home/kitchen/temperature", b"21.5", 1)
    pub.publish("home/hall/temperature", b"19", 0)
    pub.publish("home/hall/humidity", b"40", 1)  # matches no filter
    got = sub.receive(2)
    assert [(m.topic, m.payload, m.qos, m.retain) for m in got] == [
        ("home/kitchen/temperature", b"21.5", 1, False),
        ("home/hall/temperature", b"19", 0, False),
    ]
    assert sub.nothing_more()
    sub.disconnect()
    pub.disconnect()


def test_the_delivered_qos_is_the_lower_of_publish_and_subscription(
    mqtt_broker: MqttBroker,
) -> None:
    low = Paho(mqtt_broker.mqtt_port, "low")
    high = Paho(mqtt_broker.mqtt_port, "high")
    pub = Paho(mqtt_broker.mqtt_port, "pub")
    for client in (low, high, pub):
        client.connect()
    assert low.subscribe("q/#", 0) == [0]
    assert high.subscribe("q/#", 2) == [2]
    pub.publish("q/a", b"one", 1)
    pub.publish("q/b", b"zero", 0)
    pub.publish("q/c", b"two", 2)  # PUBREC, PUBREL, PUBCOMP: stored once
    assert [(m.payload, m.qos) for m in low.receive(3)] == [(b"one", 0), (b"zero", 0), (b"two", 0)]
    assert [(m.payload, m.qos) for m in high.receive(3)] == [
        (b"one", 1),
        (b"zero", 0),
        (b"two", 2),  # PUBREC, PUBREL, PUBCOMP to the subscriber
    ]
    assert low.nothing_more() and high.nothing_more()


@pytest.mark.parametrize(
    ("topic_filter", "matches", "misses"),
    [
        ("a/+/c", ["a/b/c", "a/x/c"], ["a/b/c/d", "a/c", "b/b/c"]),
        ("a/#", ["a/b", "a/b/c/d"], ["b/a"]),
        ("sport/tennis/player1", ["sport/tennis/player1"], ["sport/tennis/player2"]),
        # a dot inside a level is not a level separator (mapping swaps `.` and `/`)
        ("v/1.5/+", ["v/1.5/x"], ["v/1/5/x"]),
    ],
)
def test_filters_match_as_mqtt_says(
    mqtt_broker: MqttBroker, topic_filter: str, matches: list[str], misses: list[str]
) -> None:
    sub = Paho(mqtt_broker.mqtt_port, "sub")
    pub = Paho(mqtt_broker.mqtt_port, "pub")
    sub.connect()
    pub.connect()
    assert sub.subscribe(topic_filter, 1) == [1]
    for topic in misses + matches:
        pub.publish(topic, topic.encode(), 1)
    assert sorted(m.topic for m in sub.receive(len(matches))) == sorted(matches)
    assert sub.nothing_more()


def test_subscriptions_are_rabbitmq_named_queues_bound_to_amq_topic(
    mqtt_broker: MqttBroker,
) -> None:
    sub = Paho(mqtt_broker.mqtt_port, "dev42")
    sub.connect()
    sub.subscribe("a/+", 0)
    sub.subscribe("b/#", 1)
    status, queues, _ = mqtt_broker.http("GET", "/api/queues/%2F")
    assert status == 200
    assert isinstance(queues, list)
    by_name = {q["name"]: q for q in queues}
    assert set(by_name) == {"mqtt-subscription-dev42qos0", "mqtt-subscription-dev42qos1"}
    assert by_name["mqtt-subscription-dev42qos1"]["auto_delete"] is True  # clean session
    status, bindings, _ = mqtt_broker.http("GET", "/api/exchanges/%2F/amq.topic/bindings/source")
    assert isinstance(bindings, list)
    assert sorted((b["destination"], b["routing_key"]) for b in bindings) == [
        ("mqtt-subscription-dev42qos0", "a.*"),
        ("mqtt-subscription-dev42qos1", "b.#"),
    ]
    sub.disconnect()
    # A clean session's queues go with its connection.
    assert eventually(lambda: mqtt_broker.http("GET", "/api/queues/%2F")[1] == [])


def test_max_inflight_messages_bounds_unacknowledged_deliveries(tmp_path: Path) -> None:
    """A raw client that never PUBACKs gets `max_inflight_messages` QoS 1 deliveries and
    no more; each PUBACK lets one more out."""
    running = MqttBroker(tmp_path / "data", mqtt_max_inflight_messages=3)
    try:
        raw = RawClient(running.mqtt_port)
        raw.send(Connect(ProtocolLevel.MQTT_3_1_1, "slow", username="guest", password=b"guest"))
        assert raw.read() == ConnAck()
        raw.send(Subscribe(1, (Subscription("t", 1),)))
        assert raw.read() == SubAck(1, (1,))
        pub = Paho(running.mqtt_port, "pub")
        pub.connect()
        for n in range(6):
            pub.publish("t", str(n).encode(), 1)
        first = [raw.read() for _ in range(3)]
        assert [p.payload for p in first if isinstance(p, Publish)] == [b"0", b"1", b"2"]
        with pytest.raises(TimeoutError):
            raw.read(timeout_s=0.5)
        assert isinstance(first[0], Publish) and first[0].packet_id is not None
        raw.send(PubAck(first[0].packet_id))
        fourth = raw.read()
        assert isinstance(fourth, Publish) and fourth.payload == b"3"
        raw.close()
        pub.disconnect()
    finally:
        running.stop()


def test_the_unix_socket_listener(tmp_path: Path) -> None:
    path = str(tmp_path / "mqtt.sock")
    running = MqttBroker(tmp_path / "data", mqtt_unix_path=path)
    try:
        assert ("mqtt", path, 0) in running.listeners
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(WAIT_S)
        sock.connect(path)
        raw = RawClient(0, ProtocolLevel.MQTT_5, sock)
        # guest logs in: a unix socket's client is local, as on the AMQP socket
        raw.send(Connect(ProtocolLevel.MQTT_5, "local", username="guest", password=b"guest"))
        connack = raw.read()
        assert isinstance(connack, ConnAck) and connack.reason_code == 0
        raw.close()
    finally:
        running.stop()
