"""MQTT 5 properties and topic aliases (message_properties.py, topic_aliases.py) together
with QoS 2 deliveries and subscription options (qos2_delivery.py, subscriptions.py):
one delivery carrying the message's properties, the subscription's identifier and our
Topic Alias at QoS 2, the publisher using its own alias; No Local and Retain As
Published beside User Properties, their headers never shown as User Properties; the
client's Maximum Packet Size dropping a delivery before its alias is recorded
(docs/mqtt.md, "Topic aliases", "MQTT 5 subscription options")."""

from __future__ import annotations

from typing import Any

from paho.mqtt.subscribeoptions import SubscribeOptions

from mqtt_gateway.codec import (
    Properties,
    ProtocolLevel,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)
from tests.mqtt.clients import WAIT_S, Paho, RawClient
from tests.mqtt.conftest import MqttBroker
from tests.mqtt.test_gateway_interop import amqp_channel
from tests.mqtt.test_gateway_mqtt5_properties import publish_v5, raw_v5, received_properties

V5 = ProtocolLevel.MQTT_5
USER_PROPERTIES = (("sensor", "t-1"), ("unit", "C"))


def qos2_deliveries(raw: RawClient, count: int) -> list[Publish]:
    """The next `count` PUBLISHes, at QoS 2, taken through PUBREC, PUBREL, PUBCOMP."""
    got = []
    for _ in range(count):
        packet = raw.read()
        assert isinstance(packet, Publish) and packet.qos == 2, packet
        assert packet.packet_id is not None
        got.append(packet)
    raw.send(*(PubRec(p.packet_id) for p in got if p.packet_id is not None))
    assert [raw.read() for _ in got] == [PubRel(p.packet_id) for p in got if p.packet_id]
    raw.send(*(PubComp(p.packet_id) for p in got if p.packet_id is not None))
    return got


def test_identifier_properties_and_aliases_at_qos_2(mqtt_broker: MqttBroker) -> None:
    """A publisher setting and using its alias at QoS 2 with a content type and User
    Properties; a subscriber with Subscription Identifier 7 at QoS 2 that allows our
    aliases gets both messages with all of it, the second by alias alone."""
    sub, _ = raw_v5(mqtt_broker.mqtt_port, "combined-sub", topic_alias_maximum=4)
    sub.send(Subscribe(1, (Subscription("plant/#", 2),), Properties(subscription_identifiers=(7,))))
    assert sub.read() == SubAck(1, (2,))
    pub, _ = raw_v5(mqtt_broker.mqtt_port, "combined-pub")
    properties = Properties(
        content_type="application/json", user_properties=USER_PROPERTIES, topic_alias=3
    )
    for packet_id, topic in ((1, "plant/boiler/temp"), (2, "")):  # sets alias 3, uses it
        pub.send(Publish(topic, b'{"t": 81}', 2, False, False, packet_id, properties))
        assert pub.read() == PubRec(packet_id)
        pub.send(PubRel(packet_id))
        assert pub.read() == PubComp(packet_id)
    got = qos2_deliveries(sub, 2)
    assert [(p.topic, p.properties.topic_alias) for p in got] == [
        ("plant/boiler/temp", 1),
        ("", 1),
    ]
    for packet in got:
        assert packet.payload == b'{"t": 81}'
        assert packet.properties.subscription_identifiers == (7,)
        assert packet.properties.content_type == "application/json"
        assert packet.properties.user_properties == USER_PROPERTIES
    pub.close()
    sub.close()


def subscribe(client: Paho, topic_filter: str, **options: Any) -> None:
    client.client.subscribe(topic_filter, options=SubscribeOptions(**options))
    assert [int(c.value) for c in client.subacks.get(timeout=WAIT_S)] == [options["qos"]]


def test_no_local_and_retain_as_published_beside_user_properties(
    mqtt_broker: MqttBroker,
) -> None:
    """The publisher holds a No Local subscription, so its publishes carry its client id
    (`x-mqtt-client-id`) and, retained, `x-mqtt-retain`: an AMQP consumer sees both
    headers, MQTT 5 subscribers see only the publisher's User Properties, the publisher
    gets none of its own messages, and Retain As Published keeps the retain flag."""
    channel = amqp_channel(mqtt_broker.amqp_port)
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "amq.topic", "room.#")
    me = Paho(mqtt_broker.mqtt_port, "nl-me", version="5.0")
    assert me.connect()[1] == 0
    subscribe(me, "room/#", qos=2, noLocal=True)
    kept = Paho(mqtt_broker.mqtt_port, "nl-kept", version="5.0")
    assert kept.connect()[1] == 0
    subscribe(kept, "room/#", qos=1, retainAsPublished=True)
    plain = Paho(mqtt_broker.mqtt_port, "nl-plain", version="5.0")
    assert plain.connect()[1] == 0
    subscribe(plain, "room/#", qos=2)
    me.publish("room/1", b"warm", 1, retain=True)
    publish_v5(me, "room/2", b"cold", 2, UserProperty=list(USER_PROPERTIES))
    received = {m.payload: m for m in kept.receive(2)}
    assert received[b"warm"].retain and not received[b"cold"].retain
    assert received_properties(received[b"warm"]) == {}
    assert received_properties(received[b"cold"]) == {"UserProperty": list(USER_PROPERTIES)}
    received = {m.payload: m for m in plain.receive(2)}
    assert not received[b"warm"].retain  # no Retain As Published: 0 (MQTT-3.3.1-12)
    assert received_properties(received[b"cold"]) == {"UserProperty": list(USER_PROPERTIES)}
    assert me.nothing_more()  # No Local
    headers = {}
    for _ in range(2):
        method, properties, body = next(channel.consume(queue, inactivity_timeout=WAIT_S))
        assert method is not None
        headers[body] = properties.headers
    assert headers[b"warm"]["x-mqtt-client-id"] in ("nl-me", b"nl-me")
    assert headers[b"warm"]["x-mqtt-retain"] is True
    assert headers[b"cold"]["x-mqtt-client-id"] in ("nl-me", b"nl-me")
    assert "x-mqtt-retain" not in headers[b"cold"]
    assert headers[b"cold"]["sensor"] == "t-1"
    # Another client's message reaches the No Local subscriber, its properties intact.
    other = Paho(mqtt_broker.mqtt_port, "nl-other", version="5.0")
    assert other.connect()[1] == 0
    publish_v5(other, "room/3", b"mild", 2, UserProperty=[("from", "other")])
    [message] = me.receive(1)
    assert message.payload == b"mild" and message.qos == 2
    assert received_properties(message) == {"UserProperty": [("from", "other")]}
    channel.connection.close()
    for client in (me, kept, plain, other):
        client.disconnect()


def test_a_dropped_delivery_sets_no_alias(mqtt_broker: MqttBroker) -> None:
    """The client's Maximum Packet Size drops a delivery before its Topic Alias is
    recorded: the next topic takes alias 1, the dropped topic's next delivery sets
    alias 2 with its name (never an alias the client did not see set); one that fits
    only without a new alias's 3 bytes goes by name."""
    limit = 120
    raw, _ = raw_v5(mqtt_broker.mqtt_port, "mps", topic_alias_maximum=4,
                    maximum_packet_size=limit)  # fmt: skip
    raw.send(Subscribe(1, (Subscription("mp/#", 0),)))
    assert raw.read() == SubAck(1, (0,))
    by_name = encode(Publish("mp/edge", b"", 0), V5)
    edge = b"e" * (limit - len(by_name))  # exactly `limit` bytes by name
    assert len(encode(Publish("mp/edge", edge, 0), V5)) == limit
    aliased = Properties(topic_alias=3)
    assert len(encode(Publish("mp/edge", edge, 0, properties=aliased), V5)) > limit
    channel = amqp_channel(mqtt_broker.amqp_port)
    for routing_key, body in (
        ("mp.big", b"x" * 200),  # dropped
        ("mp.small", b"1"),
        ("mp.big", b"2"),
        ("mp.edge", edge),
        ("mp.big", b"3"),
        ("mp.edge", b"4"),
    ):
        channel.basic_publish("amq.topic", routing_key, body)
    got = []
    for _ in range(5):
        packet = raw.read()
        assert isinstance(packet, Publish) and packet.properties.subscription_identifiers == ()
        got.append((packet.topic, packet.properties.topic_alias, packet.payload))
    assert got == [
        ("mp/small", 1, b"1"),
        ("mp/big", 2, b"2"),
        ("mp/edge", None, edge),
        ("", 2, b"3"),
        ("mp/edge", 3, b"4"),
    ]
    channel.connection.close()
    raw.close()
