"""MQTT 5 subscription options through the gateway, with paho-mqtt 5.0 (and a raw client
where the limit is the client's own): No Local, Retain As Published, Retain Handling 0,
1 and 2, Subscription Identifiers in each matching PUBLISH (retained ones too), shared
subscriptions `$share/{group}/{filter}` (one queue per group, its members served in
turn), the client's Receive Maximum (QoS 1 and 2 in flight) and its Maximum Packet Size
(larger messages dropped for it, MQTT-3.1.2-25); the options of a persistent session
across a broker restart; pika publishers to a shared group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pika
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    Properties,
    ProtocolLevel,
    PubAck,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.mqtt.clients import WAIT_S, Paho, RawClient, eventually
from tests.mqtt.conftest import MqttBroker

V5 = ProtocolLevel.MQTT_5


def subscribe(
    client: Paho, topic_filter: str, identifier: int | None = None, **options: Any
) -> list[int]:
    """SUBSCRIBE with paho's SubscribeOptions (qos, noLocal, retainAsPublished,
    retainHandling) and a Subscription Identifier; the SUBACK's codes."""
    properties = None
    if identifier is not None:
        properties = PahoProperties(PacketTypes.SUBSCRIBE)
        properties.SubscriptionIdentifier = identifier
    client.client.subscribe(topic_filter, options=SubscribeOptions(**options),
                            properties=properties)  # fmt: skip
    return [int(code.value) for code in client.subacks.get(timeout=WAIT_S)]


def identifiers(message: Any) -> list[int]:
    return list(getattr(message.properties, "SubscriptionIdentifier", []))


def v5(broker: MqttBroker, client_id: str, **kwargs: Any) -> Paho:
    client = Paho(broker.mqtt_port, client_id, version="5.0", **kwargs)
    assert client.connect()[1] == 0
    return client


def test_no_local(mqtt_broker: MqttBroker) -> None:
    me = v5(mqtt_broker, "me")
    other = v5(mqtt_broker, "other")
    assert subscribe(me, "chat/#", qos=1, noLocal=True) == [1]
    me.publish("chat/mine", b"mine", 1)
    other.publish("chat/theirs", b"theirs", 1)
    assert [m.payload for m in me.receive(1)] == [b"theirs"]
    assert me.nothing_more()
    # Another subscription of the same session without No Local matches: it goes out.
    assert subscribe(me, "chat/mine", qos=1) == [1]
    me.publish("chat/mine", b"mine again", 1)
    assert [m.payload for m in me.receive(1)] == [b"mine again"]
    assert me.nothing_more()
    status, queue, _ = mqtt_broker.http("GET", "/api/queues/%2F/mqtt-subscription-meqos1")
    assert status == 200 and isinstance(queue, dict)
    assert eventually(
        lambda: (
            mqtt_broker.http("GET", "/api/queues/%2F/mqtt-subscription-meqos1")[1]["messages"]  # type: ignore[index]  # a dict, checked above
            == 0
        )
    )


def test_retain_as_published(mqtt_broker: MqttBroker) -> None:
    kept = v5(mqtt_broker, "kept")
    plain = v5(mqtt_broker, "plain")
    pub = v5(mqtt_broker, "pub")
    assert subscribe(kept, "r/#", qos=1, retainAsPublished=True) == [1]
    assert subscribe(plain, "r/#", qos=1) == [1]
    pub.publish("r/a", b"retained", 1, retain=True)
    pub.publish("r/b", b"not retained", 1)
    assert [(m.payload, m.retain) for m in kept.receive(2)] == [
        (b"retained", True),
        (b"not retained", False),
    ]
    assert [(m.payload, m.retain) for m in plain.receive(2)] == [
        (b"retained", False),
        (b"not retained", False),
    ]


def test_retain_handling(mqtt_broker: MqttBroker) -> None:
    pub = v5(mqtt_broker, "pub")
    pub.publish("status/a", b"up", 1, retain=True)
    sub = v5(mqtt_broker, "sub")
    assert subscribe(sub, "status/#", qos=1, retainHandling=0) == [1]
    assert [(m.payload, m.retain) for m in sub.receive(1)] == [(b"up", True)]
    assert subscribe(sub, "status/#", qos=1, retainHandling=0) == [1]  # again: sent again
    assert [m.payload for m in sub.receive(1)] == [b"up"]
    assert subscribe(sub, "status/#", qos=1, retainHandling=1) == [1]  # exists: none
    assert subscribe(sub, "status/+", qos=1, retainHandling=1) == [1]  # new: sent
    assert [m.payload for m in sub.receive(1)] == [b"up"]
    assert subscribe(sub, "status/a", qos=1, retainHandling=2) == [1]  # never
    assert sub.nothing_more()


def test_subscription_identifiers(mqtt_broker: MqttBroker) -> None:
    pub = v5(mqtt_broker, "pub")
    pub.publish("a/b", b"retained", 1, retain=True)
    sub = v5(mqtt_broker, "sub")
    assert subscribe(sub, "a/#", 5, qos=1) == [1]
    retained = sub.receive(1)[0]
    assert (retained.payload, identifiers(retained)) == (b"retained", [5])
    assert subscribe(sub, "a/b", 9, qos=1) == [1]
    assert identifiers(sub.receive(1)[0]) == [9]  # retained, for the new subscription
    assert subscribe(sub, "x/+", qos=1) == [1]  # no identifier
    pub.publish("a/b", b"both", 1)
    pub.publish("a/c", b"one", 1)
    pub.publish("x/y", b"none", 1)
    got = sub.receive(3)
    assert [(m.payload, sorted(identifiers(m))) for m in got] == [
        (b"both", [5, 9]),
        (b"one", [5]),
        (b"none", []),
    ]
    assert sub.nothing_more()


def test_shared_subscriptions_serve_members_in_turn(mqtt_broker: MqttBroker) -> None:
    members = [v5(mqtt_broker, f"worker-{n}") for n in range(2)]
    for member in members:
        assert subscribe(member, "$share/workers/jobs/#", qos=1) == [1]
    outsider = v5(mqtt_broker, "outsider")
    assert subscribe(outsider, "jobs/#", qos=1) == [1]
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", mqtt_broker.amqp_port)
    )
    channel = connection.channel()
    for n in range(10):
        channel.basic_publish("amq.topic", "jobs.build", str(n).encode())
    connection.close()
    shares = [sorted(int(m.payload) for m in member.receive(5)) for member in members]
    assert sorted(shares[0] + shares[1]) == list(range(10))  # each once, to one member
    assert all(member.nothing_more() for member in members)
    assert len(outsider.receive(10)) == 10  # a plain subscription gets every one
    status, bindings, _ = mqtt_broker.http("GET", "/api/queues/%2F/mqtt-shared-workers/bindings")
    assert status == 200 and isinstance(bindings, list)
    assert sorted(b["arguments"]["x-mqtt-client-id"] for b in bindings if b["source"]) == [
        "worker-0",
        "worker-1",
    ]
    # A member leaves: the other gets everything; the last one gone, the queue goes.
    assert members[0].unsubscribe("$share/workers/jobs/#")
    pub = v5(mqtt_broker, "pub")
    for n in range(4):
        pub.publish("jobs/x", str(n).encode(), 1)
    assert sorted(int(m.payload) for m in members[1].receive(4)) == [0, 1, 2, 3]
    assert members[0].nothing_more()
    members[1].disconnect()  # a clean session: its membership ends with it
    assert eventually(
        lambda: mqtt_broker.http("GET", "/api/queues/%2F/mqtt-shared-workers")[0] == 404
    )


def test_a_shared_subscription_is_refused_to_mqtt_3(mqtt_broker: MqttBroker) -> None:
    client = Paho(mqtt_broker.mqtt_port, "old")
    client.connect()
    assert client.subscribe("$share/g/t", 1) == [0x80]


def test_receive_maximum_bounds_qos_1_and_2_in_flight(mqtt_broker: MqttBroker) -> None:
    raw = RawClient(mqtt_broker.mqtt_port, V5)
    properties = Properties(receive_maximum=2)
    raw.send(Connect(V5, "small", username="guest", password=b"guest", properties=properties))
    connack = raw.read()
    assert isinstance(connack, ConnAck) and connack.reason_code == 0
    raw.send(Subscribe(1, (Subscription("one", 1), Subscription("two", 2))))
    assert raw.read() == SubAck(1, (1, 2))
    pub = v5(mqtt_broker, "pub")
    for n in range(3):
        pub.publish("one", f"one-{n}".encode(), 1)
        pub.publish("two", f"two-{n}".encode(), 2)
    first = [raw.read(), raw.read()]
    with pytest.raises(TimeoutError):
        raw.read(timeout_s=0.5)  # two in flight: the quota is spent
    qos2 = next(p for p in first if isinstance(p, Publish) and p.qos == 2)
    assert qos2.packet_id is not None
    raw.send(PubRec(qos2.packet_id))
    assert raw.read() == PubRel(qos2.packet_id)
    with pytest.raises(TimeoutError):
        raw.read(timeout_s=0.5)  # awaiting PUBCOMP still counts (MQTT 5.0 section 4.9)
    qos1 = next(p for p in first if isinstance(p, Publish) and p.qos == 1)
    assert qos1.packet_id is not None
    raw.send(PubAck(qos1.packet_id))
    third = raw.read()
    assert isinstance(third, Publish)
    with pytest.raises(TimeoutError):
        raw.read(timeout_s=0.5)
    raw.close()


def test_maximum_packet_size_drops_larger_messages(mqtt_broker: MqttBroker) -> None:
    raw = RawClient(mqtt_broker.mqtt_port, V5)
    properties = Properties(maximum_packet_size=100)
    raw.send(Connect(V5, "tiny", username="guest", password=b"guest", properties=properties))
    connack = raw.read()
    assert isinstance(connack, ConnAck) and connack.reason_code == 0
    raw.send(Subscribe(1, (Subscription("t", 1), Subscription("z", 0))))
    assert raw.read() == SubAck(1, (1, 0))
    pub = v5(mqtt_broker, "pub")
    pub.publish("t", b"a" * 50, 1)
    pub.publish("t", b"b" * 500, 1)  # past 100 bytes: dropped for this client
    pub.publish("z", b"c" * 500, 0)
    pub.publish("t", b"d" * 60, 1)
    got = [raw.read(), raw.read()]
    assert [p.payload for p in got if isinstance(p, Publish)] == [b"a" * 50, b"d" * 60]
    for packet in got:
        assert isinstance(packet, Publish) and packet.packet_id is not None
        raw.send(PubAck(packet.packet_id))
    with pytest.raises(TimeoutError):
        raw.read(timeout_s=0.5)
    # The dropped message left the queue: nothing is held for it.
    assert eventually(
        lambda: (
            mqtt_broker.http("GET", "/api/queues/%2F/mqtt-subscription-tinyqos1")[1][  # type: ignore[index]  # a dict
                "messages"
            ]
            == 0
        )
    )
    raw.close()


def test_options_of_a_persistent_session_survive_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    running = MqttBroker(data)
    try:
        sub = v5(running, "keeper", clean=False, session_expiry_s=3600)
        assert subscribe(sub, "d/#", 7, qos=2, noLocal=True) == [2]
        assert subscribe(sub, "$share/g/d/#", 8, qos=1) == [1]
        sub.disconnect()
    finally:
        running.stop()
    running = MqttBroker(data)
    try:
        sub = v5(running, "keeper", clean=False, session_expiry_s=3600)
        other = v5(running, "other")
        sub.publish("d/own", b"own", 1)  # No Local: not to its own subscription
        other.publish("d/x", b"x", 2)
        got = sub.receive(3)
        assert sorted((m.payload, m.qos, tuple(identifiers(m))) for m in got) == [
            (b"own", 1, (8,)),  # through the shared group (No Local is not allowed there)
            (b"x", 1, (8,)),
            (b"x", 2, (7,)),
        ]
        assert sub.nothing_more()
        sub.disconnect()
    finally:
        running.stop()


def test_a_binding_removed_by_an_amqp_client_is_no_subscription(mqtt_broker: MqttBroker) -> None:
    """The gateway's index of MQTT bindings (binding_index.py) checks each against the
    exchange: one an AMQP client removed is gone for UNSUBSCRIBE (0x11) too."""
    sub = v5(mqtt_broker, "watched")
    assert subscribe(sub, "a/b", qos=1) == [1]
    assert subscribe(sub, "a/c", qos=1) == [1]
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", mqtt_broker.amqp_port)
    )
    connection.channel().queue_unbind("mqtt-subscription-watchedqos1", "amq.topic", "a.b")
    connection.close()
    codes = sub.unsubscribe("a/b")
    assert [int(code.value) for code in codes] == [0x11]  # no subscription existed
    codes = sub.unsubscribe("a/c")
    assert [int(code.value) for code in codes] == [0]
