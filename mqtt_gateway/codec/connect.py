"""CONNECT and CONNACK (MQTT 3.1 section 3.1-3.2, 3.1.1 and 5.0 sections 3.1-3.2).

Owns the connection handshake's packets: the protocol name and level check, the CONNECT
flag rules (reserved bit 0 [MQTT-3.1.2-3]; will QoS and retain 0 without a will
[MQTT-3.1.2-11, -13, -15]; will QoS 3 refused; a password without a user name only in
5.0 [MQTT-3.1.2-22]), the client identifier rules of 3.1 (1 to 23 bytes) and 3.1.1
(empty only with a clean session [MQTT-3.1.3-8]), and CONNACK's flags and codes.
"""

from __future__ import annotations

from mqtt_gateway.codec.constants import (
    CLIENT_ID_BYTES_MAX_V31,
    CONNECT_FLAG_CLEAN_START,
    CONNECT_FLAG_PASSWORD,
    CONNECT_FLAG_RESERVED,
    CONNECT_FLAG_USERNAME,
    CONNECT_FLAG_WILL,
    CONNECT_FLAG_WILL_QOS_SHIFT,
    CONNECT_FLAG_WILL_RETAIN,
    PROTOCOL_NAME_BYTES_MAX,
    PROTOCOL_NAMES,
    QOS_MAX,
    PacketType,
    ProtocolLevel,
)
from mqtt_gateway.codec.errors import (
    ClientIdentifierNotValid,
    MalformedPacket,
    MqttCodecError,
    TopicNameInvalid,
    UnsupportedProtocolVersion,
)
from mqtt_gateway.codec.packets import ConnAck, Connect, Will
from mqtt_gateway.codec.properties import WILL, read_properties, write_properties
from mqtt_gateway.codec.reason_codes import CONNACK_RETURN_CODES_V3, REASON_CODES_V5
from mqtt_gateway.codec.topics import check_topic_name
from mqtt_gateway.codec.wire import Reader, Writer, check_utf8

_V5 = ProtocolLevel.MQTT_5
_SESSION_PRESENT = 0x01
_LEVELS = {int(level): level for level in ProtocolLevel}


def read_protocol(reader: Reader) -> ProtocolLevel:
    """The protocol name and level at the start of CONNECT's variable header."""
    size = reader.u16("protocol name")
    if size > PROTOCOL_NAME_BYTES_MAX:
        raise UnsupportedProtocolVersion(f"protocol name of {size} bytes")
    name = check_utf8(reader.raw(size, "protocol name"), "protocol name")
    value = reader.u8("protocol level")
    level = _LEVELS.get(value)
    if level is None or PROTOCOL_NAMES[level] != name:
        raise UnsupportedProtocolVersion(f"protocol {name!r} level {value}")
    return level


def decode_connect(reader: Reader) -> Connect:
    """Decode a CONNECT body; errors carry the level once it is known."""
    level = read_protocol(reader)
    try:
        return _decode_connect(reader, level)
    except MqttCodecError as exc:
        exc.protocol_level = level
        raise


def _decode_connect(reader: Reader, level: ProtocolLevel) -> Connect:
    flags = reader.u8("connect flags")
    _check_connect_flags(flags, level)
    keep_alive_s = reader.u16("keep alive")
    properties = read_properties(reader, PacketType.CONNECT, level)
    clean_start = bool(flags & CONNECT_FLAG_CLEAN_START)
    client_id = reader.string("client identifier")
    _check_client_id(client_id, clean_start, level, ClientIdentifierNotValid)
    will = _decode_will(reader, flags, level) if flags & CONNECT_FLAG_WILL else None
    username = reader.string("user name") if flags & CONNECT_FLAG_USERNAME else None
    password = reader.binary("password") if flags & CONNECT_FLAG_PASSWORD else None
    reader.expect_end("CONNECT")
    return Connect(
        level, client_id, clean_start, keep_alive_s, username, password, will, properties
    )


def _check_connect_flags(flags: int, level: ProtocolLevel) -> None:
    if flags & CONNECT_FLAG_RESERVED:
        raise MalformedPacket("CONNECT reserved flag set (MQTT-3.1.2-3)")
    will_qos = (flags >> CONNECT_FLAG_WILL_QOS_SHIFT) & 0b11
    if not flags & CONNECT_FLAG_WILL and (will_qos or flags & CONNECT_FLAG_WILL_RETAIN):
        raise MalformedPacket("will QoS or retain set without a will (MQTT-3.1.2-11)")
    if will_qos > QOS_MAX:
        raise MalformedPacket("will QoS 3")
    if level is not _V5 and flags & CONNECT_FLAG_PASSWORD and not flags & CONNECT_FLAG_USERNAME:
        raise MalformedPacket("password without a user name (MQTT-3.1.2-22)")


def _check_client_id(
    client_id: str, clean_start: bool, level: ProtocolLevel, error: type[Exception]
) -> None:
    if level is ProtocolLevel.MQTT_3_1:
        if not 1 <= len(client_id.encode()) <= CLIENT_ID_BYTES_MAX_V31:
            raise error(f"MQTT 3.1 client identifier not 1-{CLIENT_ID_BYTES_MAX_V31} bytes")
    elif level is ProtocolLevel.MQTT_3_1_1 and not client_id and not clean_start:
        raise error("empty client identifier without a clean session (MQTT-3.1.3-8)")


def _decode_will(reader: Reader, flags: int, level: ProtocolLevel) -> Will:
    properties = read_properties(reader, WILL, level)
    topic = reader.string("will topic")
    if not topic:
        raise TopicNameInvalid("empty will topic")
    check_topic_name(topic)
    payload = reader.binary("will payload")
    qos = (flags >> CONNECT_FLAG_WILL_QOS_SHIFT) & 0b11
    return Will(topic, payload, qos, bool(flags & CONNECT_FLAG_WILL_RETAIN), properties)


def encode_connect(packet: Connect, writer: Writer) -> None:
    """Write a CONNECT body at `packet.protocol_level`; `ValueError` for what the level
    forbids (the decoder's rules)."""
    level = packet.protocol_level
    _check_client_id(packet.client_id, packet.clean_start, level, ValueError)
    if level is not _V5 and packet.password is not None and packet.username is None:
        raise ValueError("a password without a user name needs MQTT 5.0")
    writer.string(PROTOCOL_NAMES[level], "protocol name")
    writer.u8(level)
    writer.u8(_connect_flags(packet))
    writer.u16(packet.keep_alive_s)
    write_properties(packet.properties, PacketType.CONNECT, level, writer)
    writer.string(packet.client_id, "client identifier")
    if packet.will is not None:
        _encode_will(packet.will, level, writer)
    if packet.username is not None:
        writer.string(packet.username, "user name")
    if packet.password is not None:
        writer.binary(packet.password, "password")


def _connect_flags(packet: Connect) -> int:
    flags = CONNECT_FLAG_CLEAN_START if packet.clean_start else 0
    if packet.will is not None:
        if not 0 <= packet.will.qos <= QOS_MAX:
            raise ValueError(f"will QoS {packet.will.qos}")
        flags |= CONNECT_FLAG_WILL | packet.will.qos << CONNECT_FLAG_WILL_QOS_SHIFT
        flags |= CONNECT_FLAG_WILL_RETAIN if packet.will.retain else 0
    flags |= CONNECT_FLAG_USERNAME if packet.username is not None else 0
    flags |= CONNECT_FLAG_PASSWORD if packet.password is not None else 0
    return flags


def _encode_will(will: Will, level: ProtocolLevel, writer: Writer) -> None:
    write_properties(will.properties, WILL, level, writer)
    if not will.topic:
        raise ValueError("empty will topic")
    try:
        check_topic_name(will.topic)
    except MqttCodecError as exc:
        raise ValueError(str(exc)) from exc
    writer.string(will.topic, "will topic")
    writer.binary(will.payload, "will payload")


def decode_connack(reader: Reader, level: ProtocolLevel) -> ConnAck:
    flags = reader.u8("connack flags")
    if flags & ~_SESSION_PRESENT or (flags and level is ProtocolLevel.MQTT_3_1):
        raise MalformedPacket("CONNACK reserved flags set")
    code = reader.u8("connack code")
    codes = REASON_CODES_V5[PacketType.CONNACK] if level is _V5 else CONNACK_RETURN_CODES_V3
    if code not in codes:
        raise MalformedPacket(f"CONNACK code 0x{code:02x} not defined")
    if flags and code:
        raise MalformedPacket("session present with a refusal (MQTT-3.2.2-4)")
    properties = read_properties(reader, PacketType.CONNACK, level)
    reader.expect_end("CONNACK")
    return ConnAck(code, bool(flags), properties)


def encode_connack(packet: ConnAck, level: ProtocolLevel, writer: Writer) -> None:
    codes = REASON_CODES_V5[PacketType.CONNACK] if level is _V5 else CONNACK_RETURN_CODES_V3
    if packet.reason_code not in codes:
        raise ValueError(f"CONNACK code {packet.reason_code} not defined at level {level}")
    if packet.session_present and (packet.reason_code or level is ProtocolLevel.MQTT_3_1):
        raise ValueError("session present with a refusal, or in MQTT 3.1")
    writer.u8(_SESSION_PRESENT if packet.session_present else 0)
    writer.u8(packet.reason_code)
    write_properties(packet.properties, PacketType.CONNACK, level, writer)
