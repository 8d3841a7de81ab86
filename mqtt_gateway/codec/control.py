"""PINGREQ, PINGRESP, DISCONNECT and AUTH (5.0 sections 3.12-3.15).

PINGREQ and PINGRESP, and DISCONNECT before 5.0, have no body: a remaining length other
than 0 is malformed. MQTT 5's DISCONNECT and AUTH carry an optional reason code and
properties (absent when the remaining length is 0, reason code 0x00 then; properties
absent when it is 1, 3.14.2.1 and 3.15.2.1), and the encoder writes the shortest form.
AUTH does not exist before 5.0 (packet type 15 is reserved there, refused in framing).
"""

from __future__ import annotations

from typing import Final

from mqtt_gateway.codec.constants import PacketType, ProtocolLevel
from mqtt_gateway.codec.errors import MalformedPacket
from mqtt_gateway.codec.packets import Auth, Disconnect, PingReq, PingResp
from mqtt_gateway.codec.properties import (
    NO_PROPERTIES,
    Properties,
    read_properties,
    write_properties,
)
from mqtt_gateway.codec.reason_codes import REASON_CODES_V5
from mqtt_gateway.codec.wire import Reader, Writer

_V5: Final = ProtocolLevel.MQTT_5


def decode_pingreq(_flags: int, reader: Reader, _level: ProtocolLevel) -> PingReq:
    reader.expect_end("PINGREQ")
    return PingReq()


def decode_pingresp(_flags: int, reader: Reader, _level: ProtocolLevel) -> PingResp:
    reader.expect_end("PINGRESP")
    return PingResp()


def encode_empty(_packet: object, _level: ProtocolLevel, _writer: Writer) -> int:
    return 0


def _decode_reason(
    reader: Reader, packet_type: PacketType, level: ProtocolLevel
) -> tuple[int, Properties]:
    code = 0
    properties = NO_PROPERTIES
    if reader.remaining:
        code = reader.u8("reason code")
        if code not in REASON_CODES_V5[packet_type]:
            raise MalformedPacket(f"{packet_type.name} reason code 0x{code:02x} not defined")
        if reader.remaining:
            properties = read_properties(reader, packet_type, level)
    reader.expect_end(packet_type.name)
    return code, properties


def _encode_reason(
    code: int, properties: Properties, packet_type: PacketType, writer: Writer
) -> None:
    if code not in REASON_CODES_V5[packet_type]:
        raise ValueError(f"{packet_type.name} reason code {code} not defined")
    if properties != NO_PROPERTIES:
        writer.u8(code)
        write_properties(properties, packet_type, _V5, writer)
    elif code:
        writer.u8(code)


def decode_disconnect(_flags: int, reader: Reader, level: ProtocolLevel) -> Disconnect:
    if level is not _V5:
        reader.expect_end("DISCONNECT")
        return Disconnect()
    return Disconnect(*_decode_reason(reader, PacketType.DISCONNECT, level))


def encode_disconnect(packet: Disconnect, level: ProtocolLevel, writer: Writer) -> int:
    if level is _V5:
        _encode_reason(packet.reason_code, packet.properties, PacketType.DISCONNECT, writer)
    elif packet != Disconnect():
        raise ValueError("MQTT 3.x DISCONNECT carries no reason code or properties")
    return 0


def decode_auth(_flags: int, reader: Reader, level: ProtocolLevel) -> Auth:
    return Auth(*_decode_reason(reader, PacketType.AUTH, level))


def encode_auth(packet: Auth, level: ProtocolLevel, writer: Writer) -> int:
    if level is not _V5:
        raise ValueError("AUTH exists only in MQTT 5.0")
    _encode_reason(packet.reason_code, packet.properties, PacketType.AUTH, writer)
    return 0
