"""SUBSCRIBE, SUBACK, UNSUBSCRIBE and UNSUBACK (5.0 sections 3.8-3.11).

Owns the subscription options byte (reserved bits 0 [MQTT-3.8.3-5]; QoS 3 refused; Retain
Handling 3 a protocol error; in 3.x only the QoS bits [MQTT-3-8.3-4]), the rule that a
SUBSCRIBE or UNSUBSCRIBE names at least one filter [MQTT-3.8.3-2, MQTT-3.10.3-2], no
No Local on a shared subscription [MQTT-3.8.3-4], the topic filter syntax (`topics`),
SUBSCRIPTIONS_PER_PACKET_MAX filters per packet, and each level's SUBACK/UNSUBACK codes.
"""

from __future__ import annotations

from typing import Final

from mqtt_gateway.codec.constants import (
    QOS_MAX,
    RETAIN_HANDLING_MAX,
    SUBSCRIBE_OPTION_NO_LOCAL,
    SUBSCRIBE_OPTION_QOS_MASK,
    SUBSCRIBE_OPTION_RESERVED_V3,
    SUBSCRIBE_OPTION_RESERVED_V5,
    SUBSCRIBE_OPTION_RETAIN_AS_PUBLISHED,
    SUBSCRIBE_OPTION_RETAIN_HANDLING_SHIFT,
    SUBSCRIPTIONS_PER_PACKET_MAX,
    PacketType,
    ProtocolLevel,
)
from mqtt_gateway.codec.errors import LimitExceeded, MalformedPacket, MqttCodecError, ProtocolError
from mqtt_gateway.codec.packets import SubAck, Subscribe, Subscription, UnsubAck, Unsubscribe
from mqtt_gateway.codec.properties import read_properties, write_properties
from mqtt_gateway.codec.publish import read_packet_id, write_packet_id
from mqtt_gateway.codec.reason_codes import (
    REASON_CODES_V5,
    SUBACK_RETURN_CODES_V31,
    SUBACK_RETURN_CODES_V311,
)
from mqtt_gateway.codec.topics import check_topic_filter, parse_shared
from mqtt_gateway.codec.wire import Reader, Writer

_V5: Final = ProtocolLevel.MQTT_5
_FIXED_FLAGS: Final = 0b0010


def _count_check(count: int, what: str) -> None:
    if count >= SUBSCRIPTIONS_PER_PACKET_MAX:
        raise LimitExceeded(f"more than {SUBSCRIPTIONS_PER_PACKET_MAX} filters in one {what}")


def decode_subscribe(_flags: int, reader: Reader, level: ProtocolLevel) -> Subscribe:
    packet_id = read_packet_id(reader)
    properties = read_properties(reader, PacketType.SUBSCRIBE, level)
    subscriptions: list[Subscription] = []
    while reader.remaining:
        _count_check(len(subscriptions), "SUBSCRIBE")
        topic_filter = reader.string("topic filter")
        subscriptions.append(_subscription(topic_filter, reader.u8("options"), level))
    if not subscriptions:
        raise ProtocolError("SUBSCRIBE without a topic filter (MQTT-3.8.3-2)")
    return Subscribe(packet_id, tuple(subscriptions), properties)


def _subscription(topic_filter: str, options: int, level: ProtocolLevel) -> Subscription:
    reserved = SUBSCRIBE_OPTION_RESERVED_V5 if level is _V5 else SUBSCRIBE_OPTION_RESERVED_V3
    if options & reserved:
        raise MalformedPacket(f"subscription options 0x{options:02x}: reserved bits set")
    qos = options & SUBSCRIBE_OPTION_QOS_MASK
    if qos > QOS_MAX:
        raise MalformedPacket("subscription with QoS 3")
    retain_handling = options >> SUBSCRIBE_OPTION_RETAIN_HANDLING_SHIFT
    if retain_handling > RETAIN_HANDLING_MAX:
        raise ProtocolError("retain handling 3")
    check_topic_filter(topic_filter)
    no_local = bool(options & SUBSCRIBE_OPTION_NO_LOCAL)
    if no_local and parse_shared(topic_filter) is not None:
        raise ProtocolError("no local on a shared subscription (MQTT-3.8.3-4)")
    retain_as_published = bool(options & SUBSCRIBE_OPTION_RETAIN_AS_PUBLISHED)
    return Subscription(topic_filter, qos, no_local, retain_as_published, retain_handling)


def encode_subscribe(packet: Subscribe, level: ProtocolLevel, writer: Writer) -> int:
    if not 0 < len(packet.subscriptions) <= SUBSCRIPTIONS_PER_PACKET_MAX:
        raise ValueError(f"SUBSCRIBE needs 1-{SUBSCRIPTIONS_PER_PACKET_MAX} filters")
    write_packet_id(packet.packet_id, writer)
    write_properties(packet.properties, PacketType.SUBSCRIBE, level, writer)
    for subscription in packet.subscriptions:
        options = _options(subscription, level)
        _checked_filter(subscription.topic_filter)
        writer.string(subscription.topic_filter, "topic filter")
        writer.u8(options)
    return _FIXED_FLAGS


def _options(subscription: Subscription, level: ProtocolLevel) -> int:
    if not 0 <= subscription.qos <= QOS_MAX:
        raise ValueError(f"QoS {subscription.qos}")
    if not 0 <= subscription.retain_handling <= RETAIN_HANDLING_MAX:
        raise ValueError(f"retain handling {subscription.retain_handling}")
    options = subscription.qos
    options |= SUBSCRIBE_OPTION_NO_LOCAL if subscription.no_local else 0
    options |= SUBSCRIBE_OPTION_RETAIN_AS_PUBLISHED if subscription.retain_as_published else 0
    options |= subscription.retain_handling << SUBSCRIBE_OPTION_RETAIN_HANDLING_SHIFT
    if level is not _V5 and options & SUBSCRIBE_OPTION_RESERVED_V3:
        raise ValueError("MQTT 3.x subscriptions carry a QoS only")
    if subscription.no_local and parse_shared(subscription.topic_filter) is not None:
        raise ValueError("no local on a shared subscription")
    return options


def _checked_filter(topic_filter: str) -> None:
    try:
        check_topic_filter(topic_filter)
    except MqttCodecError as exc:
        raise ValueError(str(exc)) from exc


def _suback_codes(level: ProtocolLevel) -> frozenset[int]:
    if level is _V5:
        return REASON_CODES_V5[PacketType.SUBACK]
    if level is ProtocolLevel.MQTT_3_1:
        return SUBACK_RETURN_CODES_V31
    return SUBACK_RETURN_CODES_V311


def _read_codes(reader: Reader, allowed: frozenset[int], what: str) -> tuple[int, ...]:
    if not reader.remaining:
        raise MalformedPacket(f"{what} without a reason code")
    if reader.remaining > SUBSCRIPTIONS_PER_PACKET_MAX:
        raise LimitExceeded(f"more than {SUBSCRIPTIONS_PER_PACKET_MAX} codes in one {what}")
    codes = tuple(reader.rest())
    for code in codes:
        if code not in allowed:
            raise MalformedPacket(f"{what} code 0x{code:02x} not defined")
    return codes


def _write_codes(codes: tuple[int, ...], allowed: frozenset[int], what: str, out: Writer) -> None:
    if not 0 < len(codes) <= SUBSCRIPTIONS_PER_PACKET_MAX:
        raise ValueError(f"{what} needs 1-{SUBSCRIPTIONS_PER_PACKET_MAX} codes")
    for code in codes:
        if code not in allowed:
            raise ValueError(f"{what} code {code} not defined")
        out.u8(code)


def decode_suback(_flags: int, reader: Reader, level: ProtocolLevel) -> SubAck:
    packet_id = read_packet_id(reader)
    properties = read_properties(reader, PacketType.SUBACK, level)
    return SubAck(packet_id, _read_codes(reader, _suback_codes(level), "SUBACK"), properties)


def encode_suback(packet: SubAck, level: ProtocolLevel, writer: Writer) -> int:
    write_packet_id(packet.packet_id, writer)
    write_properties(packet.properties, PacketType.SUBACK, level, writer)
    _write_codes(packet.reason_codes, _suback_codes(level), "SUBACK", writer)
    return 0


def decode_unsubscribe(_flags: int, reader: Reader, level: ProtocolLevel) -> Unsubscribe:
    packet_id = read_packet_id(reader)
    properties = read_properties(reader, PacketType.UNSUBSCRIBE, level)
    topic_filters: list[str] = []
    while reader.remaining:
        _count_check(len(topic_filters), "UNSUBSCRIBE")
        topic_filter = reader.string("topic filter")
        check_topic_filter(topic_filter)
        topic_filters.append(topic_filter)
    if not topic_filters:
        raise ProtocolError("UNSUBSCRIBE without a topic filter (MQTT-3.10.3-2)")
    return Unsubscribe(packet_id, tuple(topic_filters), properties)


def encode_unsubscribe(packet: Unsubscribe, level: ProtocolLevel, writer: Writer) -> int:
    if not 0 < len(packet.topic_filters) <= SUBSCRIPTIONS_PER_PACKET_MAX:
        raise ValueError(f"UNSUBSCRIBE needs 1-{SUBSCRIPTIONS_PER_PACKET_MAX} filters")
    write_packet_id(packet.packet_id, writer)
    write_properties(packet.properties, PacketType.UNSUBSCRIBE, level, writer)
    for topic_filter in packet.topic_filters:
        _checked_filter(topic_filter)
        writer.string(topic_filter, "topic filter")
    return _FIXED_FLAGS


def decode_unsuback(_flags: int, reader: Reader, level: ProtocolLevel) -> UnsubAck:
    packet_id = read_packet_id(reader)
    if level is not _V5:
        reader.expect_end("UNSUBACK")
        return UnsubAck(packet_id)
    properties = read_properties(reader, PacketType.UNSUBACK, level)
    codes = _read_codes(reader, REASON_CODES_V5[PacketType.UNSUBACK], "UNSUBACK")
    return UnsubAck(packet_id, codes, properties)


def encode_unsuback(packet: UnsubAck, level: ProtocolLevel, writer: Writer) -> int:
    write_packet_id(packet.packet_id, writer)
    write_properties(packet.properties, PacketType.UNSUBACK, level, writer)
    if level is _V5:
        _write_codes(packet.reason_codes, REASON_CODES_V5[PacketType.UNSUBACK], "UNSUBACK", writer)
    elif packet.reason_codes:
        raise ValueError("MQTT 3.x UNSUBACK carries no reason codes")
    return 0
