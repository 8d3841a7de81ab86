"""Differential checks of the MQTT gateway against RabbitMQ 3.10's rabbitmq_mqtt plugin
(3.1.1), on loopback ports of its own: the same paho and pika calls on both, and the
same observations where both behave alike (issue 33: RabbitMQ is the reference). What
differs on purpose (retained messages for wildcard filters, MQTT 5.0, QoS 2) is not
compared here; docs/mqtt.md lists it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

from tests.differential.peers import RabbitMQServer, free_port
from tests.integration.conftest import RunningBroker
from tests.mqtt.clients import Paho, eventually
from tests.mqtt.conftest import MqttBroker


@dataclass(frozen=True)
class MqttPeer:
    name: str
    mqtt_port: int
    amqp_port: int
    http_port: int

    def http_get(self, path: str) -> object:
        # RunningBroker's helper speaks to any management API on loopback.
        helper = RunningBroker.__new__(RunningBroker)
        helper.http_port = self.http_port
        status, body, _ = helper.http("GET", path)
        assert status == 200, (path, body)
        return body


@pytest.fixture(scope="module")
def rabbitmq_mqtt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MqttPeer]:
    port = free_port()
    server = RabbitMQServer(
        tmp_path_factory.mktemp("rabbitmq-mqtt"),
        plugins=("rabbitmq_mqtt",),
        extra_config=f"mqtt.listeners.tcp.1 = 127.0.0.1:{port}\nmqtt.allow_anonymous = false\n",
    )
    try:
        # The plugin's listener opens after the management port answers.
        assert eventually(lambda: _accepts(port), timeout_s=60), server.log_tail()
        yield MqttPeer("rabbitmq", port, server.amqp_port, server.http_port)
    finally:
        server.stop()


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def streamq_mqtt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MqttPeer]:
    running = MqttBroker(Path(tmp_path_factory.mktemp("streamq-mqtt")) / "data")
    try:
        yield MqttPeer("streamq", running.mqtt_port, running.amqp_port, running.http_port)
    finally:
        running.stop()


@pytest.fixture(params=["rabbitmq", "streamq"])
def peer(request: pytest.FixtureRequest) -> MqttPeer:
    found: MqttPeer = request.getfixturevalue(f"{request.param}_mqtt")
    return found


def queues_of(peer: MqttPeer, client_id: str) -> list[tuple[str, bool, bool]]:
    queues = peer.http_get("/api/queues/%2F")
    assert isinstance(queues, list)
    return sorted(
        (q["name"], q["durable"], q["auto_delete"]) for q in queues if client_id in q["name"]
    )


def bindings_of(peer: MqttPeer, client_id: str) -> list[tuple[str, str]]:
    bindings = peer.http_get("/api/exchanges/%2F/amq.topic/bindings/source")
    assert isinstance(bindings, list)
    return sorted(
        (b["destination"], b["routing_key"]) for b in bindings if client_id in b["destination"]
    )


def test_subscription_queues_and_bindings(peer: MqttPeer) -> None:
    persistent = Paho(peer.mqtt_port, "diff-keep", clean=False)
    assert persistent.connect() == (False, 0)
    assert persistent.subscribe("a/+/c", 0) == [0]
    assert persistent.subscribe("b/#", 1) == [1]
    clean = Paho(peer.mqtt_port, "diff-clean")
    clean.connect()
    assert clean.subscribe("x/y", 1) == [1]
    # The one difference: RabbitMQ 3.10 makes a persistent session's QoS 0 queue
    # auto-delete, so its QoS 0 subscriptions end with the connection; streamq keeps them
    # as the session state MQTT-3.1.2-4 says (docs/mqtt.md, "Differences").
    qos0_kept = (True, False) if peer.name == "streamq" else (False, True)
    assert queues_of(peer, "diff-keep") == [
        ("mqtt-subscription-diff-keepqos0", *qos0_kept),
        ("mqtt-subscription-diff-keepqos1", True, False),
    ]
    assert bindings_of(peer, "diff-keep") == [
        ("mqtt-subscription-diff-keepqos0", "a.*.c"),
        ("mqtt-subscription-diff-keepqos1", "b.#"),
    ]
    assert [name for name, _d, _a in queues_of(peer, "diff-clean")] == [
        "mqtt-subscription-diff-cleanqos1"
    ]
    clean.disconnect()
    persistent.disconnect()
    assert eventually(lambda: queues_of(peer, "diff-clean") == [])
    again = Paho(peer.mqtt_port, "diff-keep", clean=False)
    assert again.connect() == (True, 0)
    again.disconnect()
    wipe = Paho(peer.mqtt_port, "diff-keep", clean=True)
    assert wipe.connect() == (False, 0)
    wipe.disconnect()


def test_bad_credentials(peer: MqttPeer) -> None:
    # paho reports the 3.1.1 return code 4 (bad user name or password) as 0x86
    assert Paho(peer.mqtt_port, "diff-bad", password="wrong").connect()[1] == 0x86
    assert Paho(peer.mqtt_port, "diff-nobody", username="nobody").connect()[1] == 0x86


def test_amqp_and_mqtt_see_each_other_alike(peer: MqttPeer) -> None:
    sub = Paho(peer.mqtt_port, "diff-sub")
    sub.connect()
    sub.subscribe("t/+", 1)
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", peer.amqp_port))
    channel = connection.channel()
    channel.queue_declare("diff-work", auto_delete=True)
    channel.queue_bind("diff-work", "amq.topic", "t.*")
    channel.basic_publish("amq.topic", "t.amqp", b"from amqp")
    pub = Paho(peer.mqtt_port, "diff-pub")
    pub.connect()
    pub.publish("t/mqtt0", b"qos0", 0)
    pub.publish("t/mqtt1", b"qos1", 1)
    got = sorted((m.topic, m.payload, m.qos) for m in sub.receive(3))
    assert got == [("t/amqp", b"from amqp", 1), ("t/mqtt0", b"qos0", 0), ("t/mqtt1", b"qos1", 1)]
    seen = []
    for _ in range(3):
        method, properties, body = channel.basic_get("diff-work", auto_ack=True)
        assert method is not None
        headers = properties.headers or {}
        seen.append(
            (method.routing_key, body, properties.delivery_mode, headers.get("x-mqtt-publish-qos"))
        )
    assert sorted(seen, key=lambda s: s[0]) == [
        ("t.amqp", b"from amqp", None, None),
        ("t.mqtt0", b"qos0", 1, 0),
        ("t.mqtt1", b"qos1", 2, 1),
    ]
    connection.close()
    sub.disconnect()
    pub.disconnect()


def test_retained_message_for_an_exact_filter(peer: MqttPeer) -> None:
    pub = Paho(peer.mqtt_port, "diff-retain")
    pub.connect()
    pub.publish("diff/retained", b"kept", 1, retain=True)
    sub = Paho(peer.mqtt_port, "diff-retain-sub")
    sub.connect()
    assert sub.subscribe("diff/retained", 1) == [1]
    [message] = sub.receive(1)
    assert (message.topic, message.payload, message.retain) == ("diff/retained", b"kept", True)
    pub.publish("diff/retained", b"", 1, retain=True)  # cleared
    later = Paho(peer.mqtt_port, "diff-retain-late")
    later.connect()
    later.subscribe("diff/retained", 1)
    assert later.nothing_more(1.0)
    for client in (pub, sub, later):
        client.disconnect()
