"""Each rule the codec enforces, one case each: the bytes, the error class and the reason
code (and the 3.x CONNACK return code where one exists). Bytes are written out by hand
from the specifications' layouts, so the tests do not lean on our encoder."""

from __future__ import annotations

import pytest

from mqtt_gateway.codec import (
    Auth,
    ClientIdentifierNotValid,
    ConnAck,
    ConnackReturnCode,
    Connect,
    Decoder,
    Disconnect,
    LimitExceeded,
    MalformedPacket,
    MqttCodecError,
    Packet,
    PacketTooLarge,
    Properties,
    ProtocolError,
    ProtocolLevel,
    PubAck,
    Publish,
    ReasonCode,
    SubAck,
    Subscribe,
    Subscription,
    TopicAliasInvalid,
    TopicFilterInvalid,
    TopicNameInvalid,
    UnsubAck,
    Unsubscribe,
    UnsupportedProtocolVersion,
    Will,
    encode,
)
from mqtt_gateway.codec.constants import (
    SUBSCRIPTIONS_PER_PACKET_MAX,
    TOPIC_LEVELS_MAX,
    USER_PROPERTIES_MAX,
)
from mqtt_gateway.codec.wire import varint_bytes

V31, V311, V5 = ProtocolLevel.MQTT_3_1, ProtocolLevel.MQTT_3_1_1, ProtocolLevel.MQTT_5


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + varint_bytes(len(body)) + body


def s(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(2, "big") + data


def connect(name: str, level: int, flags: int, payload: bytes, props: bytes = b"") -> bytes:
    properties = (varint_bytes(len(props)) + props) if level == 5 else b""
    return packet(0x10, s(name) + bytes([level, flags]) + b"\x00\x3c" + properties + payload)


def pub5(topic: str, props: bytes, first: int = 0x30) -> bytes:
    return packet(first, s(topic) + varint_bytes(len(props)) + props + b"payload")


def sub(level: ProtocolLevel, filters: list[tuple[str, int]], props: bytes = b"") -> bytes:
    body = b"\x00\x01" + ((varint_bytes(len(props)) + props) if level is V5 else b"")
    body += b"".join(s(topic) + bytes([options]) for topic, options in filters)
    return packet(0x82, body)


MALFORMED, PROTOCOL, LIMIT = MalformedPacket, ProtocolError, LimitExceeded
VERSION, CLIENT_ID = UnsupportedProtocolVersion, ClientIdentifierNotValid
NAME, FILTER, ALIAS = TopicNameInvalid, TopicFilterInvalid, TopicAliasInvalid

REASON_CODES: dict[type[MqttCodecError], int] = {
    # Each error's MQTT 5.0 reason code, from the spec's table 2-6.
    MalformedPacket: 0x81,
    ProtocolError: 0x82,
    UnsupportedProtocolVersion: 0x84,
    ClientIdentifierNotValid: 0x85,
    TopicFilterInvalid: 0x8F,
    TopicNameInvalid: 0x90,
    TopicAliasInvalid: 0x94,
    PacketTooLarge: 0x95,
    LimitExceeded: 0x97,
}


def c4(flags: int, payload: bytes) -> bytes:
    return connect("MQTT", 4, flags, payload)


def c5(flags: int, payload: bytes, props: bytes = b"") -> bytes:
    return connect("MQTT", 5, flags, payload, props)


TOO_MANY_USER_PROPERTIES = (b"\x26" + s("k") + s("v")) * (USER_PROPERTIES_MAX + 1)
WILL_WITH_SESSION_EXPIRY = c5(0x06, s("c") + b"\x05\x11\x00\x00\x00\x01" + s("t") + s("m"))

CASES: list[tuple[str, ProtocolLevel | None, bytes, type[MqttCodecError]]] = [
    # fixed header
    ("remaining length with a fifth byte", V311, b"\x30\xff\xff\xff\xff\x01", MALFORMED),
    ("remaining length not shortest", V311, b"\xc0\x80\x00", MALFORMED),
    ("reserved packet type 0", V311, b"\x00\x00", MALFORMED),
    ("AUTH before 5.0", V311, b"\xf0\x00", MALFORMED),
    ("PINGREQ with flags", V311, b"\xc1\x00", MALFORMED),
    ("PUBREL without 0b0010", V311, b"\x60\x02\x00\x01", MALFORMED),
    ("SUBSCRIBE without 0b0010", V311, b"\x80\x06\x00\x01\x00\x01a\x00", MALFORMED),
    ("UNSUBSCRIBE without 0b0010", V311, b"\xa0\x05\x00\x01\x00\x01a", MALFORMED),
    ("PINGREQ with a body", V311, b"\xc0\x01\x00", MALFORMED),
    ("DISCONNECT 3.1.1 with a body", V311, b"\xe0\x01\x00", MALFORMED),
    ("packet before CONNECT", None, b"\xc0\x00", PROTOCOL),
    # CONNECT
    ("unknown level", None, connect("MQTT", 6, 0x02, s("c")), VERSION),
    ("MQTT name with level 3", None, connect("MQTT", 3, 0x02, s("c")), VERSION),
    ("MQIsdp name with level 4", None, connect("MQIsdp", 4, 0x02, s("c")), VERSION),
    ("reserved connect flag", None, c4(0x03, s("c")), MALFORMED),
    ("will QoS without will", None, c4(0x0A, s("c")), MALFORMED),
    ("will retain without will", None, c4(0x22, s("c")), MALFORMED),
    ("will QoS 3", None, c4(0x1E, s("c") + s("t") + s("m")), MALFORMED),
    ("3.1.1 password without user name", None, c4(0x42, s("c") + s("pw")), MALFORMED),
    ("3.1.1 empty id, no clean session", None, c4(0x00, s("")), CLIENT_ID),
    ("3.1 empty id", None, connect("MQIsdp", 3, 0x02, s("")), CLIENT_ID),
    ("3.1 id of 24 bytes", None, connect("MQIsdp", 3, 0x02, s("x" * 24)), CLIENT_ID),
    ("will topic with a wildcard", None, c4(0x06, s("c") + s("a/#") + s("m")), NAME),
    ("trailing bytes after CONNECT", None, c4(0x02, s("c") + b"\x00"), MALFORMED),
    ("client id with U+0000", None, c4(0x02, s("a\x00b")), MALFORMED),
    ("id with an encoded surrogate", None, c4(0x02, s(b"\xed\xa0\x80")), MALFORMED),
    ("id with an overlong encoding", None, c4(0x02, s(b"\xc0\xaf")), MALFORMED),
    ("client id truncated", None, c4(0x02, b"\x00\x05ab"), MALFORMED),
    # PUBLISH
    ("QoS 3", V311, packet(0x36, s("a") + b"\x00\x01"), MALFORMED),
    ("DUP with QoS 0", V311, packet(0x38, s("a")), MALFORMED),
    ("wildcard in a topic name", V311, packet(0x30, s("a/+")), NAME),
    ("'#' in a topic name", V5, pub5("a/#", b""), NAME),
    ("3.1.1 empty topic name", V311, packet(0x30, s("")), NAME),
    ("5.0 empty topic without alias", V5, pub5("", b""), PROTOCOL),
    ("packet identifier 0", V311, packet(0x32, s("a") + b"\x00\x00"), PROTOCOL),
    ("PUBACK identifier 0", V311, packet(0x40, b"\x00\x00"), PROTOCOL),
    ("topic of too many levels", V311, packet(0x30, s("/" * TOPIC_LEVELS_MAX)), NAME),
    # properties
    ("unknown property", V5, pub5("a", b"\x07\x00"), MALFORMED),
    ("property not valid in PUBLISH", V5, pub5("a", b"\x11\x00\x00\x00\x01"), MALFORMED),
    ("duplicated content type", V5, pub5("a", b"\x03" + s("x") + b"\x03" + s("y")), PROTOCOL),
    ("payload format indicator 2", V5, pub5("a", b"\x01\x02"), PROTOCOL),
    ("topic alias 0", V5, pub5("a", b"\x23\x00\x00"), ALIAS),
    ("subscription identifier 0", V5, pub5("a", b"\x0b\x00"), PROTOCOL),
    ("SUBSCRIBE with 2 subscription ids", V5, sub(V5, [("a", 0)], b"\x0b\x01\x0b\x02"), PROTOCOL),
    ("property length past the packet", V5, packet(0x30, s("a") + b"\x05\x01"), MALFORMED),
    ("too many user properties", V5, pub5("a", TOO_MANY_USER_PROPERTIES), LIMIT),
    ("receive maximum 0", None, c5(0x02, s("c"), b"\x21\x00\x00"), PROTOCOL),
    ("maximum packet size 0", None, c5(0x02, s("c"), b"\x27\x00\x00\x00\x00"), PROTOCOL),
    ("request problem information 2", None, c5(0x02, s("c"), b"\x17\x02"), PROTOCOL),
    ("auth data without a method", None, c5(0x02, s("c"), b"\x16" + s("d")), PROTOCOL),
    ("will delay in CONNECT", None, c5(0x02, s("c"), b"\x18\x00\x00\x00\x01"), MALFORMED),
    ("session expiry in will properties", None, WILL_WITH_SESSION_EXPIRY, MALFORMED),
    # SUBSCRIBE / UNSUBSCRIBE
    ("SUBSCRIBE without a filter", V311, packet(0x82, b"\x00\x01"), PROTOCOL),
    ("UNSUBSCRIBE without a filter", V5, packet(0xa2, b"\x00\x01\x00"), PROTOCOL),
    ("subscription QoS 3", V311, sub(V311, [("a", 3)]), MALFORMED),
    ("3.1.1 options beyond QoS", V311, sub(V311, [("a", 0x04)]), MALFORMED),
    ("5.0 reserved option bits", V5, sub(V5, [("a", 0x40)]), MALFORMED),
    ("retain handling 3", V5, sub(V5, [("a", 0x30)]), PROTOCOL),
    ("no local on a shared subscription", V5, sub(V5, [("$share/g/a", 0x04)]), PROTOCOL),
    ("'#' not last", V311, sub(V311, [("a/#/b", 0)]), FILTER),
    ("'#' inside a level", V311, sub(V311, [("a/b#", 0)]), FILTER),
    ("'+' inside a level", V311, sub(V311, [("a+/b", 0)]), FILTER),
    ("empty filter", V311, sub(V311, [("", 0)]), FILTER),
    ("$share without a filter", V5, sub(V5, [("$share/g", 0)]), FILTER),
    ("$share with an empty group", V5, sub(V5, [("$share//a", 0)]), FILTER),
    ("$share with a wildcard group", V5, sub(V5, [("$share/g+/a", 0)]), FILTER),
    ("too many filters", V311, sub(V311, [("a", 0)] * (SUBSCRIPTIONS_PER_PACKET_MAX + 1)), LIMIT),
    # acks
    ("CONNACK reserved flags", V311, packet(0x20, b"\x02\x00"), MALFORMED),
    ("CONNACK session present with refusal", V311, packet(0x20, b"\x01\x05"), MALFORMED),
    ("CONNACK return code 6", V311, packet(0x20, b"\x00\x06"), MALFORMED),
    ("3.1 SUBACK failure code", V31, packet(0x90, b"\x00\x01\x80"), MALFORMED),
    ("SUBACK without codes", V311, packet(0x90, b"\x00\x01"), MALFORMED),
    ("PUBACK reason not in its table", V5, packet(0x40, b"\x00\x01\x92"), MALFORMED),
    ("DISCONNECT reason not in its table", V5, packet(0xe0, b"\x01"), MALFORMED),
    ("AUTH reason not in its table", V5, packet(0xf0, b"\x87"), MALFORMED),
]  # fmt: skip


@pytest.mark.parametrize(("what", "level", "data", "error"), CASES, ids=[c[0] for c in CASES])
def test_refusal(
    what: str, level: ProtocolLevel | None, data: bytes, error: type[MqttCodecError]
) -> None:
    decoder = Decoder(level)
    with pytest.raises(error) as caught:
        decoder.feed(data)
    assert type(caught.value) is error, what
    assert caught.value.reason_code == REASON_CODES[error]
    # The decoder is spent: the connection closes, nothing more is parsed.
    with pytest.raises(error):
        decoder.feed(b"\xc0\x00")


def test_3_x_connack_return_codes() -> None:
    for data, code in [
        (connect("MQTT", 6, 0x02, s("c")), ConnackReturnCode.UNACCEPTABLE_PROTOCOL_VERSION),
        (connect("MQTT", 4, 0x00, s("")), ConnackReturnCode.IDENTIFIER_REJECTED),
        (connect("MQIsdp", 3, 0x02, s("x" * 24)), ConnackReturnCode.IDENTIFIER_REJECTED),
        (connect("MQTT", 4, 0x03, s("c")), None),
    ]:
        with pytest.raises(MqttCodecError) as caught:
            Decoder().feed(data)
        assert caught.value.connack_return_code == code


def test_an_error_in_connect_knows_the_level() -> None:
    with pytest.raises(MalformedPacket) as caught:
        Decoder().feed(connect("MQTT", 4, 0x03, s("c")))
    assert caught.value.protocol_level is V311
    with pytest.raises(ProtocolError) as caught_v5:
        Decoder().feed(connect("MQTT", 5, 0x02, s("c"), b"\x21\x00\x00"))
    assert caught_v5.value.protocol_level is V5


def test_oversize_is_refused_from_the_remaining_length_alone() -> None:
    decoder = Decoder(V311, packet_bytes_max=100)
    # 2 bytes of header + 99 of body = 101 > 100: refused with only the header in hand.
    with pytest.raises(PacketTooLarge, match="101 bytes") as caught:
        decoder.feed(b"\x30\x63")
    assert caught.value.reason_code == ReasonCode.PACKET_TOO_LARGE
    assert decoder.buffered == 0
    exact = Decoder(V311, packet_bytes_max=100)
    body = s("t") + b"x" * 95
    assert exact.feed(packet(0x30, body)) == [Publish("t", b"x" * 95)]
    # The largest remaining length (268,435,455) is refused at the default limit too.
    with pytest.raises(PacketTooLarge):
        Decoder(V311).feed(b"\x30\xff\xff\xff\x7f")


def test_the_buffer_holds_at_most_one_partial_packet() -> None:
    decoder = Decoder(V311, packet_bytes_max=64)
    data = encode(Publish("t", b"x" * 50), V311)
    assert decoder.feed(data * 3 + data[:40]) == [Publish("t", b"x" * 50)] * 3
    assert decoder.buffered == 40


def test_packets_before_a_bad_one_are_kept_on_the_error() -> None:
    good = encode(Publish("a", b"1"), V311)
    with pytest.raises(TopicNameInvalid) as caught:
        Decoder(V311).feed(good + good + packet(0x30, s("a/+")))
    assert caught.value.packets_before == (Publish("a", b"1"), Publish("a", b"1"))


def test_5_0_allows_a_password_without_a_user_name() -> None:
    packets = Decoder().feed(connect("MQTT", 5, 0x42, s("c") + s("pw")))
    assert packets[0].password == b"pw" and packets[0].username is None


def test_5_0_allows_an_empty_client_id_without_clean_start() -> None:
    assert Decoder().feed(connect("MQTT", 5, 0x00, s("")))[0].client_id == ""


def test_5_0_allows_an_empty_topic_with_an_alias() -> None:
    (publish,) = Decoder(V5).feed(pub5("", b"\x23\x00\x07"))
    assert publish.topic == "" and publish.properties.topic_alias == 7


def test_subscription_identifiers_repeat_in_publish() -> None:
    (publish,) = Decoder(V5).feed(pub5("a", b"\x0b\x01\x0b\x80\x01"))
    assert publish.properties.subscription_identifiers == (1, 128)


ENCODER_REFUSALS: list[tuple[Packet, ProtocolLevel]] = [
    (Publish("a/+", b""), V311),
    (Publish("a", b"", qos=1), V311),
    (Publish("a", b"", qos=0, packet_id=3), V311),
    (Publish("a", b"", qos=3, packet_id=3), V311),
    (Publish("a", b"", dup=True), V311),
    (Publish("a\x00", b""), V311),
    (Publish("\ud800", b""), V311),
    (Publish("", b""), V5),
    (Publish("a", b"", properties=Properties(content_type="x")), V311),
    (Publish("a", b"", properties=Properties(session_expiry_interval_s=1)), V5),
    (Publish("a", b"", properties=Properties(topic_alias=0)), V5),
    (Publish("a", b"", properties=Properties(payload_format_indicator=2)), V5),
    (PubAck(0), V311),
    (PubAck(1, 0x10), V311),
    (PubAck(1, 0x92), V5),
    (ConnAck(5, True), V311),
    (ConnAck(0, True), V31),
    (ConnAck(0x86), V311),
    (Connect(V311, "c", password=b"p"), V311),
    (Connect(V311, "", clean_start=False), V311),
    (Connect(V31, "x" * 24), V31),
    (Connect(V5, "c"), V311),
    (Connect(V5, "c", will=Will("a/#", b"")), V5),
    (Subscribe(1, ()), V311),
    (Subscribe(1, (Subscription("a/#/b"),)), V311),
    (Subscribe(1, (Subscription("a", no_local=True),)), V311),
    (Subscribe(1, (Subscription("$share/g/a", no_local=True),)), V5),
    (Subscribe(1, (Subscription("a"),), Properties(subscription_identifiers=(1, 2))), V5),
    (SubAck(1, (0x80,)), V31),
    (SubAck(1, ()), V311),
    (UnsubAck(1, (0,)), V311),
    (Unsubscribe(1, ()), V5),
    (Disconnect(0x04), V311),
    (Auth(), V311),
    (Auth(0x87), V5),
    (Auth(properties=Properties(authentication_data=b"d")), V5),
]


@pytest.mark.parametrize(("packet_value", "level"), ENCODER_REFUSALS)
def test_the_encoder_refuses_what_the_decoder_would(
    packet_value: Packet, level: ProtocolLevel
) -> None:
    with pytest.raises(ValueError):
        encode(packet_value, level)
