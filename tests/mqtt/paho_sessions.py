"""paho-mqtt sessions against the loopback `Responder`, shared by the tests and by the
capture of seed bytes (tests/mqtt/capture.py). Each session waits on paho's callbacks
with a timeout and returns what they reported."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.mqtt.responder import Responder

WAIT_S: Final = 10.0
PROTOCOLS: Final = {"3.1": mqtt.MQTTv31, "3.1.1": mqtt.MQTTv311, "5.0": mqtt.MQTTv5}
TOPICS: Final = ("sensors/0", "sensors/1", "sensors/2")


@dataclass
class Events:
    """What paho's callbacks reported, each with an event set when it fired."""

    connect: list[Any] = field(default_factory=list)
    subscribe: list[Any] = field(default_factory=list)
    unsubscribe: list[Any] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    messages: list[mqtt.MQTTMessage] = field(default_factory=list)
    connected: threading.Event = field(default_factory=threading.Event)
    subscribed: threading.Event = field(default_factory=threading.Event)
    unsubscribed: threading.Event = field(default_factory=threading.Event)
    all_published: threading.Event = field(default_factory=threading.Event)
    all_received: threading.Event = field(default_factory=threading.Event)


def client(version: str, events: Events, expected: int = len(TOPICS)) -> mqtt.Client:
    paho = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"paho-{version}",
                       protocol=PROTOCOLS[version])  # fmt: skip

    def on_connect(_c: Any, _u: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        events.connect.append((flags, reason_code, properties))
        events.connected.set()

    def on_subscribe(_c: Any, _u: Any, _mid: int, codes: Any, properties: Any) -> None:
        events.subscribe.append((codes, properties))
        events.subscribed.set()

    def on_unsubscribe(_c: Any, _u: Any, _mid: int, codes: Any, properties: Any) -> None:
        events.unsubscribe.append((codes, properties))
        events.unsubscribed.set()

    def on_publish(_c: Any, _u: Any, mid: int, _code: Any, _properties: Any) -> None:
        events.published.append(mid)
        if len(events.published) == expected:
            events.all_published.set()

    def on_message(_c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        events.messages.append(message)
        if len(events.messages) == expected:
            events.all_received.set()

    paho.on_connect = on_connect
    paho.on_subscribe = on_subscribe
    paho.on_unsubscribe = on_unsubscribe
    paho.on_publish = on_publish
    paho.on_message = on_message
    return paho


def v5_properties(packet_type: int, **values: Any) -> PahoProperties:
    properties = PahoProperties(packet_type)
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


def connect_only(responder: Responder, version: str) -> Events:
    """CONNECT (with a will, user name and password, and properties in 5.0), then
    DISCONNECT once CONNACK is in."""
    events = Events()
    paho = client(version, events)
    paho.username_pw_set("device-1", "secret")
    will_properties = None
    connect_properties = None
    if version == "5.0":
        will_properties = v5_properties(
            PacketTypes.WILLMESSAGE, WillDelayInterval=5, ContentType="text/plain",
            MessageExpiryInterval=60, UserProperty=[("k", "v")],
        )  # fmt: skip
        connect_properties = v5_properties(
            PacketTypes.CONNECT, SessionExpiryInterval=300, ReceiveMaximum=20,
            MaximumPacketSize=65536, TopicAliasMaximum=8, RequestProblemInformation=1,
            UserProperty=[("client", "paho"), ("client", "again")],
        )  # fmt: skip
    paho.will_set("devices/device-1/status", b"offline", qos=1, retain=True,
                  properties=will_properties)  # fmt: skip
    paho.connect("127.0.0.1", responder.port, keepalive=30, properties=connect_properties)
    paho.loop_start()
    try:
        events.connected.wait(WAIT_S)
    finally:
        paho.disconnect()
        paho.loop_stop()
    return events


def subscribe_and_publish(responder: Responder, version: str) -> Events:
    """SUBSCRIBE three topics at QoS 0, 1 and 2, PUBLISH once to each at that QoS (the
    responder echoes them back), UNSUBSCRIBE, DISCONNECT."""
    events = Events()
    paho = client(version, events)
    paho.connect("127.0.0.1", responder.port, keepalive=30)
    paho.loop_start()
    try:
        if not events.connected.wait(WAIT_S):
            return events
        v5 = version == "5.0"
        topics = [
            (topic, SubscribeOptions(qos=qos) if v5 else qos) for qos, topic in enumerate(TOPICS)
        ]
        sub_properties = (
            v5_properties(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=7) if v5 else None
        )
        paho.subscribe(topics, properties=sub_properties)
        if not events.subscribed.wait(WAIT_S):
            return events
        for qos, topic in enumerate(TOPICS):
            properties = None
            if v5:
                properties = v5_properties(
                    PacketTypes.PUBLISH, ContentType="application/json", ResponseTopic="replies/1",
                    CorrelationData=b"\x00\x01", UserProperty=[("n", str(qos))],
                    PayloadFormatIndicator=1, MessageExpiryInterval=30,
                )  # fmt: skip
            paho.publish(topic, f'{{"n": {qos}}}'.encode(), qos=qos, properties=properties)
        events.all_published.wait(WAIT_S)
        events.all_received.wait(WAIT_S)
        paho.unsubscribe(list(TOPICS))
        events.unsubscribed.wait(WAIT_S)
    finally:
        paho.disconnect()
        paho.loop_stop()
    return events
