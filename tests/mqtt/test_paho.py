"""Our codec against a real client: paho-mqtt 2.x at MQTT 3.1, 3.1.1 and 5.0.

Method: paho connects over loopback TCP to `Responder`, a peer that is nothing but our
decoder and encoder (the broker's MQTT listener is later work). The test checks both
directions: what paho sent decodes to the packets paho was asked to send (every field,
the 5.0 properties included), and paho accepts what we encode (its callbacks fire with
the reason codes, properties and messages we sent).
"""

from __future__ import annotations

import pytest

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    Disconnect,
    Properties,
    ProtocolLevel,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    Subscribe,
    Subscription,
    Unsubscribe,
    Will,
)
from tests.mqtt.paho_sessions import TOPICS, connect_only, subscribe_and_publish
from tests.mqtt.responder import Responder

LEVELS = {
    "3.1": ProtocolLevel.MQTT_3_1,
    "3.1.1": ProtocolLevel.MQTT_3_1_1,
    "5.0": ProtocolLevel.MQTT_5,
}
VERSIONS = list(LEVELS)

CONNACK_PROPERTIES = Properties(
    session_expiry_interval_s=300,
    assigned_client_identifier="assigned-1",
    server_keep_alive_s=20,
    receive_maximum=10,
    maximum_qos=1,
    retain_available=1,
    reason_string="welcome",
    user_properties=(("server", "streamq"),),
    maximum_packet_size=1_048_576,
    wildcard_subscription_available=1,
    subscription_identifier_available=1,
    shared_subscription_available=1,
)


def expected_connect(version: str) -> Connect:
    level = LEVELS[version]
    will_properties = Properties()
    properties = Properties()
    if version == "5.0":
        will_properties = Properties(
            will_delay_interval_s=5, content_type="text/plain", message_expiry_interval_s=60,
            user_properties=(("k", "v"),),
        )  # fmt: skip
        properties = Properties(
            session_expiry_interval_s=300, receive_maximum=20, maximum_packet_size=65536,
            topic_alias_maximum=8, request_problem_information=1,
            user_properties=(("client", "paho"), ("client", "again")),
        )  # fmt: skip
    will = Will("devices/device-1/status", b"offline", 1, True, will_properties)
    return Connect(level, f"paho-{version}", True, 30, "device-1", b"secret", will, properties)


@pytest.mark.parametrize("version", VERSIONS)
def test_paho_connect_decodes_and_our_connack_is_accepted(version: str) -> None:
    v5 = version == "5.0"
    connack = ConnAck(properties=CONNACK_PROPERTIES) if v5 else ConnAck()
    with Responder(connack=lambda _connect: connack) as responder:
        events = connect_only(responder, version)
    assert responder.errors == []
    assert len(events.connect) == 1, "paho's on_connect did not fire"
    _flags, reason_code, properties = events.connect[0]
    assert reason_code.value == 0 and not reason_code.is_failure
    (connection,) = responder.connections
    assert connection.packets == [expected_connect(version), Disconnect()]
    if v5:
        assert properties.AssignedClientIdentifier == "assigned-1"
        assert properties.ServerKeepAlive == 20
        assert properties.MaximumQoS == 1
        assert properties.ReasonString == "welcome"
        assert properties.UserProperty == [("server", "streamq")]


REFUSALS = [
    # paho's version 2 callbacks report a 3.x return code as the 5.0 reason code of the
    # same meaning, so these say which one it must have read.
    ("3.1", 5, ReasonCode.NOT_AUTHORIZED),
    ("3.1.1", 4, ReasonCode.BAD_USER_NAME_OR_PASSWORD),
    ("3.1.1", 3, ReasonCode.SERVER_UNAVAILABLE),
    ("5.0", ReasonCode.BAD_USER_NAME_OR_PASSWORD, ReasonCode.BAD_USER_NAME_OR_PASSWORD),
    ("5.0", ReasonCode.NOT_AUTHORIZED, ReasonCode.NOT_AUTHORIZED),
    ("5.0", ReasonCode.USE_ANOTHER_SERVER, ReasonCode.USE_ANOTHER_SERVER),
]


@pytest.mark.parametrize(("version", "code", "reported"), REFUSALS)
def test_paho_reports_our_refusal_codes(version: str, code: int, reported: int) -> None:
    with Responder(connack=lambda _connect: ConnAck(code)) as responder:
        events = connect_only(responder, version)
    assert responder.errors == []
    assert len(events.connect) == 1
    _flags, reason_code, _properties = events.connect[0]
    assert reason_code.value == reported and reason_code.is_failure


@pytest.mark.parametrize("version", VERSIONS)
def test_paho_subscribe_publish_qos_0_1_2(version: str) -> None:
    v5 = version == "5.0"
    with Responder() as responder:
        events = subscribe_and_publish(responder, version)
    assert responder.errors == []
    # paho accepted our SUBACK, PUBACK, PUBREC/PUBCOMP, PUBLISH (and PUBREL) and UNSUBACK.
    assert [[code.value for code in codes] for codes, _ in events.subscribe] == [[0, 1, 2]]
    assert sorted(events.published) == sorted(set(events.published)) and len(events.published) == 3
    received = sorted((m.topic, m.qos, m.payload) for m in events.messages)
    assert received == [
        (topic, qos, f'{{"n": {qos}}}'.encode()) for qos, topic in enumerate(TOPICS)
    ]
    assert len(events.unsubscribe) == 1
    if v5:
        for message in events.messages:
            assert message.properties.ContentType == "application/json"
            assert message.properties.CorrelationData == b"\x00\x01"
            assert message.properties.UserProperty == [("n", str(message.qos))]
    (connection,) = responder.connections
    packets = connection.packets
    assert isinstance(packets[0], Connect) and packets[0].protocol_level is LEVELS[version]
    subscribe = next(p for p in packets if isinstance(p, Subscribe))
    assert subscribe.subscriptions == tuple(Subscription(t, q) for q, t in enumerate(TOPICS))
    assert subscribe.properties.subscription_identifiers == ((7,) if v5 else ())
    publishes = [p for p in packets if isinstance(p, Publish)]
    assert [(p.topic, p.qos, p.packet_id is not None) for p in publishes] == [
        (topic, qos, qos > 0) for qos, topic in enumerate(TOPICS)
    ]
    if v5:
        assert publishes[2].properties.response_topic == "replies/1"
        assert publishes[2].properties.payload_format_indicator == 1
    # paho's side of the QoS 2 handshake (for its publish and for our echo) and its
    # PUBACK for our QoS 1 echo.
    kinds = {type(p) for p in packets}
    assert {PubRel, PubRec, PubComp, PubAck, Unsubscribe} <= kinds
    assert packets[-1] == Disconnect()
