"""PUBLISH and its acknowledgements PUBACK, PUBREC, PUBREL, PUBCOMP (5.0 sections 3.3-3.7).

Owns the PUBLISH fixed-header flags (QoS 3 refused, DUP only with QoS 1 or 2
[MQTT-3.3.1-2]), the topic name rules (no wildcard [MQTT-3.3.2-2]; empty only beside a
Topic Alias in 5.0, a protocol error otherwise), the non-zero packet identifier of QoS 1
and 2 and of every ack [MQTT-2.2.1-3], and MQTT 5's short forms of the acks (no reason
code and properties when the remaining length stops after the packet identifier; no
properties when it stops after the reason code, 3.4.2.1), which the encoder also uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from mqtt_gateway.codec.constants import (
    PUBLISH_FLAG_DUP,
    PUBLISH_FLAG_RETAIN,
    PUBLISH_QOS_SHIFT,
    QOS_MAX,
    PacketType,
    ProtocolLevel,
)
from mqtt_gateway.codec.errors import (
    MalformedPacket,
    MqttCodecError,
    ProtocolError,
    TopicNameInvalid,
)
from mqtt_gateway.codec.packets import PubAck, PubComp, Publish, PublishAck, PubRec, PubRel
from mqtt_gateway.codec.properties import NO_PROPERTIES, read_properties, write_properties
from mqtt_gateway.codec.reason_codes import REASON_CODES_V5
from mqtt_gateway.codec.topics import check_topic_name
from mqtt_gateway.codec.wire import Reader, Writer

_V5: Final = ProtocolLevel.MQTT_5
_PACKET_ID_MAX: Final = 0xFFFF


def read_packet_id(reader: Reader) -> int:
    """A packet identifier, which is never 0 (MQTT-2.2.1-3)."""
    packet_id = reader.u16("packet identifier")
    if packet_id == 0:
        raise ProtocolError("packet identifier 0 (MQTT-2.2.1-3)")
    return packet_id


def write_packet_id(packet_id: int, writer: Writer) -> None:
    if not 0 < packet_id <= _PACKET_ID_MAX:
        raise ValueError(f"packet identifier {packet_id} not in 1-65535")
    writer.u16(packet_id)


def decode_publish(flags: int, reader: Reader, level: ProtocolLevel) -> Publish:
    qos = (flags >> PUBLISH_QOS_SHIFT) & 0b11
    if qos > QOS_MAX:
        raise MalformedPacket("PUBLISH with QoS 3 (MQTT-3.3.1-4)")
    dup = bool(flags & PUBLISH_FLAG_DUP)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH DUP set with QoS 0 (MQTT-3.3.1-2)")
    topic = reader.string("topic name")
    check_topic_name(topic)
    packet_id = read_packet_id(reader) if qos else None
    properties = read_properties(reader, PacketType.PUBLISH, level)
    if not topic and properties.topic_alias is None:
        if level is _V5:
            raise ProtocolError("empty topic name without a topic alias (3.3.2.3.4)")
        raise TopicNameInvalid("empty topic name (MQTT-4.7.3-1)")
    retain = bool(flags & PUBLISH_FLAG_RETAIN)
    return Publish(topic, reader.rest(), qos, retain, dup, packet_id, properties)


def encode_publish(packet: Publish, level: ProtocolLevel, writer: Writer) -> int:
    """Write a PUBLISH body; return its fixed-header flags."""
    if not 0 <= packet.qos <= QOS_MAX:
        raise ValueError(f"QoS {packet.qos}")
    if (packet.packet_id is None) != (packet.qos == 0) or (packet.dup and packet.qos == 0):
        raise ValueError("a packet identifier and DUP go with QoS 1 and 2 only")
    if not packet.topic and (level is not _V5 or packet.properties.topic_alias is None):
        raise ValueError("an empty topic name needs a topic alias (MQTT 5.0)")
    try:
        check_topic_name(packet.topic)
    except MqttCodecError as exc:
        raise ValueError(str(exc)) from exc
    writer.string(packet.topic, "topic name")
    if packet.packet_id is not None:
        write_packet_id(packet.packet_id, writer)
    write_properties(packet.properties, PacketType.PUBLISH, level, writer)
    writer.out += packet.payload
    flags = packet.qos << PUBLISH_QOS_SHIFT
    flags |= PUBLISH_FLAG_DUP if packet.dup else 0
    return flags | (PUBLISH_FLAG_RETAIN if packet.retain else 0)


AckClass = type[PubAck] | type[PubRec] | type[PubRel] | type[PubComp]


def ack_decoder(cls: AckClass) -> Callable[[int, Reader, ProtocolLevel], PublishAck]:
    """The decoder of one of the four acks (they share a layout)."""
    codes = REASON_CODES_V5[cls.type]

    def decode(_flags: int, reader: Reader, level: ProtocolLevel) -> PublishAck:
        packet_id = read_packet_id(reader)
        code = 0
        properties = NO_PROPERTIES
        if level is _V5 and reader.remaining:
            code = reader.u8("reason code")
            if code not in codes:
                raise MalformedPacket(f"{cls.type.name} reason code 0x{code:02x} not defined")
            if reader.remaining:
                properties = read_properties(reader, cls.type, level)
        reader.expect_end(cls.type.name)
        return cls(packet_id, code, properties)

    return decode


def encode_ack(packet: PublishAck, level: ProtocolLevel, writer: Writer) -> int:
    """Write a PUBACK/PUBREC/PUBREL/PUBCOMP body in its shortest form; return the flags."""
    write_packet_id(packet.packet_id, writer)
    if level is not _V5:
        if packet.reason_code or packet.properties != NO_PROPERTIES:
            raise ValueError(f"MQTT level {level} acks carry no reason code or properties")
    elif packet.reason_code not in REASON_CODES_V5[packet.type]:
        raise ValueError(f"{packet.type.name} reason code {packet.reason_code} not defined")
    elif packet.properties != NO_PROPERTIES:
        writer.u8(packet.reason_code)
        write_properties(packet.properties, packet.type, level, writer)
    elif packet.reason_code:
        writer.u8(packet.reason_code)
    return 0b0010 if isinstance(packet, PubRel) else 0
