"""The codec's one error family: every refusal of peer bytes is an `MqttCodecError`.

Each error carries the MQTT 5.0 `reason_code` a server closes with (in a CONNACK when the
CONNECT itself is refused, else in a DISCONNECT) and, where MQTT 3.1/3.1.1 has one, the
CONNACK `connack_return_code` to answer a refused CONNECT with (3.1.1 section 3.2.2.3);
without one, a 3.x server just closes the connection (3.1.1 section 4.8). The session maps
codec errors to packets in one place. Encoders refuse values the wire cannot carry with
`ValueError` (a programmer error, not a peer's).

Two families as the 5.0 spec's section 4.13 has them: `MalformedPacket` (0x81, the bytes
do not parse by the spec's rules) and `ProtocolError` (0x82, they parse but break a rule),
the latter with subclasses for the rules that have a reason code of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqtt_gateway.codec.constants import ProtocolLevel
from mqtt_gateway.codec.reason_codes import ConnackReturnCode, ReasonCode

if TYPE_CHECKING:  # packets imports properties, which raises these errors
    from mqtt_gateway.codec.packets import Packet


class MqttCodecError(Exception):
    """Bytes from the peer that are not a valid MQTT packet.

    `protocol_level` is the connection's level when known (the decoder sets it, from the
    CONNECT being decoded once its level byte is read), so the session knows whether to
    answer with a 3.x return code, a 5.0 reason code, or neither."""

    reason_code: ReasonCode = ReasonCode.MALFORMED_PACKET
    connack_return_code: ConnackReturnCode | None = None
    protocol_level: ProtocolLevel | None = None
    packets_before: tuple[Packet, ...] = ()
    """The packets `Decoder.feed` decoded in the same call before the bad one."""


class MalformedPacket(MqttCodecError):
    """Truncated, trailing bytes, a bad length or flag, ill-formed UTF-8, an unknown field."""


class ProtocolError(MqttCodecError):
    """Well-formed bytes that break a rule: a duplicated property, a value out of range."""

    reason_code = ReasonCode.PROTOCOL_ERROR


class PacketTooLarge(ProtocolError):
    """A remaining length that takes the packet past the connection's maximum packet size."""

    reason_code = ReasonCode.PACKET_TOO_LARGE


class UnsupportedProtocolVersion(ProtocolError):
    """A CONNECT whose protocol name and level are not 3.1, 3.1.1 or 5.0."""

    reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    connack_return_code = ConnackReturnCode.UNACCEPTABLE_PROTOCOL_VERSION


class ClientIdentifierNotValid(ProtocolError):
    """3.1: not 1 to 23 bytes; 3.1.1: empty without a clean session (MQTT-3.1.3-8)."""

    reason_code = ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
    connack_return_code = ConnackReturnCode.IDENTIFIER_REJECTED


class TopicNameInvalid(ProtocolError):
    """A PUBLISH or will topic with a wildcard, or empty where no topic alias stands in."""

    reason_code = ReasonCode.TOPIC_NAME_INVALID


class TopicFilterInvalid(ProtocolError):
    """A topic filter with a misplaced wildcard, or a malformed `$share/group/filter`."""

    reason_code = ReasonCode.TOPIC_FILTER_INVALID


class TopicAliasInvalid(ProtocolError):
    """A Topic Alias property of 0 (MQTT-3.3.2-8)."""

    reason_code = ReasonCode.TOPIC_ALIAS_INVALID


class LimitExceeded(ProtocolError):
    """More of something than the codec's named limits allow (constants.py): user
    properties, subscription identifiers, topic filters in one packet."""

    reason_code = ReasonCode.QUOTA_EXCEEDED
