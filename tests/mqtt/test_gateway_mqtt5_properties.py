"""MQTT 5.0 PUBLISH properties through the broker, end to end with real clients: paho 5.0
to pika (AMQP properties and headers, RabbitMQ 4's mapping), pika to paho 5.0 and 3.1.1,
paho to paho, paho to an rstream consumer of a stream (AMQP 1.0 properties), message
expiry as a per-message TTL with the interval left on delivery (MQTT-3.3.2-6), the
Payload Format Indicator check (0x99) and Topic Aliases both ways
(docs/mqtt.md, "MQTT 5 properties and AMQP properties", "Topic aliases")."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

import pika
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    Disconnect,
    Properties,
    ProtocolLevel,
    PubAck,
    Publish,
    ReasonCode,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)
from tests.mqtt.clients import WAIT_S, Paho, RawClient
from tests.mqtt.conftest import MqttBroker
from tests.mqtt.test_gateway_interop import amqp_channel
from tests.node_clients import installed, run_script

V5 = ProtocolLevel.MQTT_5
NODE_DIR = Path(__file__).parent / "node"


def paho_properties(**values: Any) -> PahoProperties:
    properties = PahoProperties(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


def publish_v5(client: Paho, topic: str, payload: bytes, qos: int, **values: Any) -> None:
    """A paho 5.0 publish with PUBLISH properties; for QoS 1, wait for its PUBACK."""
    info = client.client.publish(topic, payload, qos, properties=paho_properties(**values))
    if qos:
        with client._lock:
            event = client.acked.setdefault(info.mid, threading.Event())
        assert event.wait(WAIT_S), f"no PUBACK for {topic}"
    else:
        info.wait_for_publish(WAIT_S)


def received_properties(message: Any) -> dict[str, Any]:
    """The PUBLISH properties paho reports for a message (absent ones left out)."""
    names = ("ContentType", "CorrelationData", "ResponseTopic", "UserProperty")
    names += ("MessageExpiryInterval", "PayloadFormatIndicator", "TopicAlias")
    props = message.properties
    return {name: getattr(props, name) for name in names if hasattr(props, name)}


def raw_v5(port: int, client_id: str, **connect_properties: Any) -> tuple[RawClient, ConnAck]:
    raw = RawClient(port, V5)
    properties = Properties(**connect_properties)
    raw.send(Connect(V5, client_id, True, 60, "guest", b"guest", None, properties))
    connack = raw.read()
    assert isinstance(connack, ConnAck) and connack.reason_code == 0, connack
    return raw, connack


FULL = {
    "ContentType": "application/json",
    "CorrelationData": b"req-42",
    "ResponseTopic": "replies/dev-1",
    "UserProperty": [("site", "lyon"), ("x-trace", "abc"), ("site", "paris")],
    "PayloadFormatIndicator": 1,
}


def test_paho_5_properties_reach_pika_and_paho(mqtt_broker: MqttBroker) -> None:
    channel = amqp_channel(mqtt_broker.amqp_port)
    channel.queue_declare("work", durable=True)
    channel.queue_bind("work", "amq.topic", "orders.#")
    sub = Paho(mqtt_broker.mqtt_port, "sub5", version="5.0")
    sub.connect()
    sub.subscribe("orders/#", 1)
    pub = Paho(mqtt_broker.mqtt_port, "pub5", version="5.0")
    pub.connect()
    publish_v5(pub, "orders/eu", b'{"n": 1}', 1, MessageExpiryInterval=60, **FULL)
    method, properties, body = channel.basic_get("work", auto_ack=True)
    assert method is not None and body == b'{"n": 1}'
    assert properties.content_type == "application/json"
    assert properties.correlation_id == "req-42"
    assert properties.expiration == "60000"
    assert properties.delivery_mode == 2
    assert properties.headers == {
        "x-mqtt-publish-qos": 1,
        "x-mqtt-dup": False,
        "x-mqtt-payload-format-indicator": 1,
        "x-reply-to-topic": "replies.dev-1",
        "site": "lyon",  # the first of a repeated name: AMQP tables hold one
        "x-trace": "abc",
        # the whole list, for MQTT subscribers
        "x-mqtt-user-property": [["site", "lyon"], ["x-trace", "abc"], ["site", "paris"]],
    }
    (message,) = sub.receive(1)
    got = received_properties(message)
    assert 50 <= got.pop("MessageExpiryInterval") <= 60  # the interval left
    assert got == FULL  # user properties in order, repeats kept (MQTT-3.3.2-17, -18)
    channel.connection.close()
    for client in (sub, pub):
        client.disconnect()


def test_pika_properties_reach_paho_5_and_3_1_1_alike(mqtt_broker: MqttBroker) -> None:
    """An AMQP message reaches a 5.0 subscriber with its properties, and a 3.1.1 one with
    the same topic, payload and QoS (3.1.1 has no properties)."""
    sub5 = Paho(mqtt_broker.mqtt_port, "sub5", version="5.0")
    sub5.connect()
    sub5.subscribe("rpc/#", 1)
    sub3 = Paho(mqtt_broker.mqtt_port, "sub3", version="3.1.1")
    sub3.connect()
    sub3.subscribe("rpc/#", 1)
    channel = amqp_channel(mqtt_broker.amqp_port)
    amqp_properties = pika.BasicProperties(
        content_type="text/plain",
        correlation_id="call-7",
        expiration="30000",
        headers={"x-reply-to-topic": "rpc.replies.client-1", "attempt": 2, "urgent": True},
    )
    channel.basic_publish("amq.topic", "rpc.requests", b"ping", amqp_properties)
    binary = pika.BasicProperties(headers={"x-correlation-id": b"\x00\xff"})
    channel.basic_publish("amq.topic", "rpc.requests", b"pong", binary)
    first, second = sub5.receive(2)
    assert (first.topic, first.payload, first.qos) == ("rpc/requests", b"ping", 1)
    got = received_properties(first)
    assert 20 <= got.pop("MessageExpiryInterval") <= 30
    assert got == {
        "ContentType": "text/plain",
        "CorrelationData": b"call-7",
        "ResponseTopic": "rpc/replies/client-1",
        "UserProperty": [("attempt", "2"), ("urgent", "true")],
    }
    assert received_properties(second) == {"CorrelationData": b"\x00\xff"}
    plain = sub3.receive(2)
    assert [(m.topic, m.payload, m.qos) for m in plain] == [
        ("rpc/requests", b"ping", 1),
        ("rpc/requests", b"pong", 1),
    ]
    channel.connection.close()
    for client in (sub5, sub3):
        client.disconnect()


def test_paho_3_1_1_and_5_publishes_look_alike_to_pika(mqtt_broker: MqttBroker) -> None:
    channel = amqp_channel(mqtt_broker.amqp_port)
    channel.queue_declare("both")
    channel.queue_bind("both", "amq.topic", "same.#")
    seen = []
    for version in ("3.1.1", "5.0"):
        pub = Paho(mqtt_broker.mqtt_port, f"pub-{version}", version=version)
        pub.connect()
        pub.publish("same/topic", b"x", 1)
        pub.disconnect()
        method, properties, body = channel.basic_get("both", auto_ack=True)
        assert method is not None
        seen.append((method.routing_key, body, properties))
    assert seen[0] == seen[1]
    channel.connection.close()


def test_a_message_expires_as_any_ttl(mqtt_broker: MqttBroker) -> None:
    """Message Expiry Interval is the message's own TTL: gone from an AMQP queue and
    from a persistent session's queue once it passes; a longer one is delivered later
    with what is left of it."""
    channel = amqp_channel(mqtt_broker.amqp_port)
    channel.queue_declare("later", durable=True)
    channel.queue_bind("later", "amq.topic", "ttl.#")
    port = mqtt_broker.mqtt_port
    sub = Paho(port, "away", version="5.0", clean=False, session_expiry_s=600)
    sub.connect()
    sub.subscribe("ttl/#", 1)
    sub.disconnect()
    pub = Paho(port, "pub", version="5.0")
    pub.connect()
    publish_v5(pub, "ttl/short", b"short", 1, MessageExpiryInterval=1)
    publish_v5(pub, "ttl/long", b"long", 1, MessageExpiryInterval=100)
    time.sleep(2.5)  # past the short one's interval; bounded
    method, _p, body = channel.basic_get("later", auto_ack=True)
    assert method is not None and body == b"long"
    assert channel.basic_get("later", auto_ack=True)[0] is None
    back = Paho(port, "away", version="5.0", clean=False, session_expiry_s=600)
    assert back.connect()[0]  # session present
    (message,) = back.receive(1)
    assert message.payload == b"long"
    assert 85 <= received_properties(message)["MessageExpiryInterval"] <= 98
    assert back.nothing_more()
    channel.connection.close()
    for client in (back, pub):
        client.disconnect()


def test_a_stream_consumer_sees_amqp_1_0_properties(tmp_path: Path) -> None:
    broker = MqttBroker(tmp_path / "data", stream_port=0)
    try:
        channel = amqp_channel(broker.amqp_port)
        channel.queue_declare("feed", durable=True, arguments={"x-queue-type": "stream"})
        channel.queue_bind("feed", "amq.topic", "meters.#")
        pub = Paho(broker.mqtt_port, "meter", version="5.0")
        pub.connect()
        publish_v5(pub, "meters/7", b"42", 1, **FULL)
        pub.disconnect()
        message = asyncio.run(first_stream_message(broker.stream_port, "feed"))
        assert bytes(message.body) == b"42"
        assert message.properties.content_type == b"application/json"
        assert message.properties.correlation_id == b"req-42"
        assert message.application_properties == {b"site": b"lyon"}
        annotations = message.message_annotations
        assert annotations[b"x-trace"] == b"abc"  # x- user properties: annotations, as RabbitMQ
        assert annotations[b"x-reply-to-topic"] == b"replies.dev-1"
        channel.connection.close()
    finally:
        broker.stop()


async def first_stream_message(port: int, stream: str) -> AMQPMessage:
    got: asyncio.Queue[AMQPMessage] = asyncio.Queue()

    async def on_message(message: AMQPMessage, _context: object) -> None:
        await got.put(message)

    login: dict[str, Any] = {"username": "guest", "password": "guest"}
    async with Consumer("127.0.0.1", port, **login) as consumer:
        spec = ConsumerOffsetSpecification(OffsetType.FIRST)
        await consumer.subscribe(
            stream, on_message, decoder=amqp_decoder, offset_specification=spec
        )
        return await asyncio.wait_for(got.get(), WAIT_S)


@pytest.mark.parametrize("qos", [0, 1])
def test_a_payload_not_utf8_is_refused_with_0x99(mqtt_broker: MqttBroker, qos: int) -> None:
    raw, _ = raw_v5(mqtt_broker.mqtt_port, "bad-payload")
    indicated = Properties(payload_format_indicator=1)
    raw.send(Publish("t/ok", "é".encode(), 1, False, False, 1, indicated))
    assert raw.read() == PubAck(1)
    raw.send(Publish("t/bad", b"\xff\xfe", qos, False, False, 2 if qos else None, indicated))
    if qos:
        assert raw.read() == PubAck(2, ReasonCode.PAYLOAD_FORMAT_INVALID)
    else:
        assert raw.read() == Disconnect(ReasonCode.PAYLOAD_FORMAT_INVALID)
        assert raw.closed_by_peer()
    raw.close()


def test_inbound_topic_aliases(tmp_path: Path) -> None:
    broker = MqttBroker(tmp_path / "data", mqtt_topic_alias_maximum=2)
    try:
        channel = amqp_channel(broker.amqp_port)
        channel.queue_declare("aliased")
        channel.queue_bind("aliased", "amq.topic", "#")
        raw, connack = raw_v5(broker.mqtt_port, "aliaser")
        assert connack.properties.topic_alias_maximum == 2
        raw.send(
            Publish("long/topic/name", b"1", 1, False, False, 1, Properties(topic_alias=2)),
            Publish("", b"2", 1, False, False, 2, Properties(topic_alias=2)),
            Publish("other", b"3", 0, False, False, None, Properties(topic_alias=1)),
            Publish("", b"4", 1, False, False, 3, Properties(topic_alias=1)),
        )
        assert [raw.read() for _ in range(3)] == [PubAck(1), PubAck(2), PubAck(3)]
        got = []
        for _ in range(4):
            method, _p, body = channel.basic_get("aliased", auto_ack=True)
            assert method is not None
            got.append((method.routing_key, body))
        long_name = "long.topic.name"
        assert got == [(long_name, b"1"), (long_name, b"2"), ("other", b"3"), ("other", b"4")]
        raw.send(Publish("x", b"5", 0, False, False, None, Properties(topic_alias=3)))
        assert raw.read() == Disconnect(ReasonCode.TOPIC_ALIAS_INVALID)  # past CONNACK's 2
        raw.close()
        unknown, _ = raw_v5(broker.mqtt_port, "aliaser-2")
        unknown.send(Publish("", b"6", 0, False, False, None, Properties(topic_alias=1)))
        assert unknown.read() == Disconnect(ReasonCode.PROTOCOL_ERROR)  # never set here
        unknown.close()
        channel.connection.close()
    finally:
        broker.stop()


def test_no_topic_alias_maximum_no_aliases(tmp_path: Path) -> None:
    broker = MqttBroker(tmp_path / "data", mqtt_topic_alias_maximum=0)
    try:
        raw, connack = raw_v5(broker.mqtt_port, "none")
        assert connack.properties.topic_alias_maximum is None  # absent: 0
        raw.send(Publish("a", b"", 0, False, False, None, Properties(topic_alias=1)))
        assert raw.read() == Disconnect(ReasonCode.TOPIC_ALIAS_INVALID)
        raw.close()
    finally:
        broker.stop()


def test_outbound_topic_aliases(mqtt_broker: MqttBroker) -> None:
    """A client announcing Topic Alias Maximum 1 gets its first topic aliased: the topic
    name and alias once, then the alias alone; other topics by name."""
    raw, _ = raw_v5(mqtt_broker.mqtt_port, "small", topic_alias_maximum=1)
    raw.send(Subscribe(1, (Subscription("al/#", 0),)))
    assert isinstance(raw.read(), SubAck)
    channel = amqp_channel(mqtt_broker.amqp_port)
    for routing_key in ("al.one", "al.one", "al.two", "al.one"):
        channel.basic_publish("amq.topic", routing_key, routing_key.encode())
    got = []
    for _ in range(4):
        packet = raw.read()
        assert isinstance(packet, Publish)
        got.append((packet.topic, packet.properties.topic_alias, packet.payload))
    assert got == [
        ("al/one", 1, b"al.one"),
        ("", 1, b"al.one"),
        ("al/two", None, b"al.two"),
        ("", 1, b"al.one"),
    ]
    channel.connection.close()
    raw.close()


def test_no_outbound_aliases_unless_the_client_allows(mqtt_broker: MqttBroker) -> None:
    sub = Paho(mqtt_broker.mqtt_port, "paho-no-alias", version="5.0")
    sub.connect()
    sub.subscribe("na/#", 0)
    channel = amqp_channel(mqtt_broker.amqp_port)
    for _ in range(2):
        channel.basic_publish("amq.topic", "na.x", b"m")
    assert [(m.topic, received_properties(m)) for m in sub.receive(2)] == [("na/x", {})] * 2
    channel.connection.close()
    sub.disconnect()


def test_retained_messages_keep_their_properties_and_expire(tmp_path: Path) -> None:
    """A retained 5.0 publish is sent to later subscribers with its properties (and the
    expiry interval left), across a restart; once its interval passes it is gone."""
    data = tmp_path / "data"
    broker = MqttBroker(data)
    try:
        pub = Paho(broker.mqtt_port, "pub", version="5.0")
        pub.connect()
        values = {"ContentType": "text/plain", "UserProperty": [("unit", "C")]}
        info = pub.client.publish(
            "room/temp", b"21", 1, retain=True, properties=paho_properties(**values)
        )
        info.wait_for_publish(WAIT_S)
        short = paho_properties(MessageExpiryInterval=2)
        pub.client.publish("room/door", b"open", 1, retain=True, properties=short)
        early = Paho(broker.mqtt_port, "early", version="5.0")
        early.connect()
        early.subscribe("room/door", 1)
        (door,) = early.receive(1)
        assert door.payload == b"open"
        assert received_properties(door)["MessageExpiryInterval"] in (1, 2)
        for client in (pub, early):
            client.disconnect()
    finally:
        broker.stop()
    broker = MqttBroker(data)
    try:
        time.sleep(2.5)  # past room/door's interval; bounded
        sub = Paho(broker.mqtt_port, "sub", version="5.0")
        sub.connect()
        sub.subscribe("room/+", 1)
        (message,) = sub.receive(1)
        assert (message.topic, message.payload, message.retain) == ("room/temp", b"21", True)
        assert received_properties(message) == values
        assert sub.nothing_more()  # room/door expired
        old = Paho(broker.mqtt_port, "old", version="3.1.1")
        old.connect()
        old.subscribe("room/+", 1)
        assert [(m.topic, m.payload) for m in old.receive(1)] == [("room/temp", b"21")]
        assert old.nothing_more()
        for client in (sub, old):
            client.disconnect()
    finally:
        broker.stop()


def test_mqtt_js_with_topic_aliases_and_properties(tmp_path: Path) -> None:
    """MQTT.js 5.16 assigns its own Topic Aliases (reusing them past our maximum of 2)
    and resolves ours, properties going both ways: what it published reaches pika under
    the right routing keys and comes back to it whole."""
    broker = MqttBroker(tmp_path / "data", mqtt_topic_alias_maximum=2)
    try:
        channel = amqp_channel(broker.amqp_port)
        channel.queue_declare("js")
        channel.queue_bind("js", "amq.topic", "js5.#")
        installed(NODE_DIR, "mqtt")
        result = run_script(NODE_DIR / "mqtt5_gateway.js", str(broker.mqtt_port), timeout=60)
        assert result.stdout.strip(), result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert result.returncode == 0 and report["error"] is None, report
        assert report["connack"]["properties"]["topicAliasMaximum"] == 2
        topics = ["js5/a", "js5/b", "js5/c"] * 2
        messages = report["messages"]
        assert [(m["topic"], m["payload"]) for m in messages] == [
            (topic, f"m{n}") for n, topic in enumerate(topics)
        ]
        # ours: the first two topics aliased (1, 2), the third by name
        assert [m["topicAlias"] for m in messages] == [1, 2, None, 1, 2, None]
        for n, message in enumerate(messages):
            assert message["contentType"] == "text/plain"
            assert message["correlationData"] == [n, 255]
            assert message["responseTopic"] == "js5/replies"
            assert message["userProperties"] == {"n": str(n)}
            assert message["payloadFormatIndicator"] is True
            assert 280 <= message["messageExpiryInterval"] <= 300
        keys = []
        for _ in topics:
            method, _p, _body = channel.basic_get("js", auto_ack=True)
            assert method is not None
            keys.append(method.routing_key)
        assert keys == [topic.replace("/", ".") for topic in topics]
        channel.connection.close()
    finally:
        broker.stop()


def test_a_wills_properties_go_with_it(mqtt_broker: MqttBroker) -> None:
    """A will's properties are mapped as a PUBLISH's; a will whose payload is not the
    UTF-8 its Payload Format Indicator says is refused at CONNECT (0x99)."""
    port = mqtt_broker.mqtt_port
    watcher = Paho(port, "watcher", version="5.0")
    watcher.connect()
    watcher.subscribe("wills/#", 1)
    will_properties = Properties(
        content_type="text/plain", user_properties=(("why", "lost"),), payload_format_indicator=1
    )
    will = Will("wills/dev", b"gone", 1, False, will_properties)
    connect = Connect(V5, "dev", True, 60, "guest", b"guest", will)
    rude = RawClient(port, V5)
    rude.send(connect)
    assert isinstance(rude.read(), ConnAck)
    rude.close()  # no DISCONNECT: the will goes
    (message,) = watcher.receive(1)
    assert message.payload == b"gone"
    assert received_properties(message) == {
        "ContentType": "text/plain",
        "UserProperty": [("why", "lost")],
        "PayloadFormatIndicator": 1,
    }
    bad = RawClient(port, V5)
    bad.send(dataclasses.replace(connect, will=dataclasses.replace(will, payload=b"\xff")))
    assert bad.read() == ConnAck(ReasonCode.PAYLOAD_FORMAT_INVALID)
    assert bad.closed_by_peer()
    bad.close()
    watcher.disconnect()


def test_outbound_aliases_stay_within_our_maximum(tmp_path: Path) -> None:
    broker = MqttBroker(tmp_path / "data", mqtt_topic_alias_maximum=1)
    try:
        raw, _ = raw_v5(broker.mqtt_port, "greedy", topic_alias_maximum=100)
        raw.send(Subscribe(1, (Subscription("g/#", 0),)))
        assert isinstance(raw.read(), SubAck)
        channel = amqp_channel(broker.amqp_port)
        for routing_key in ("g.one", "g.two", "g.one"):
            channel.basic_publish("amq.topic", routing_key, b"")
        got = []
        for _ in range(3):
            packet = raw.read()
            assert isinstance(packet, Publish)
            got.append((packet.topic, packet.properties.topic_alias))
        assert got == [("g/one", 1), ("g/two", None), ("", 1)]
        channel.connection.close()
        raw.close()
    finally:
        broker.stop()
