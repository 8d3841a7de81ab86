"""MQTT's numbers: packet types, protocol levels, fixed-header flags and every limit.

Values are the OASIS specifications' (MQTT 3.1.1 section 2, MQTT 5.0 section 2) and IBM's
MQTT 3.1 ("MQIsdp"). This module owns no behaviour; every length and count the codec
bounds is named here, so docs/mqtt.md can list them from one place.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final


class PacketType(IntEnum):
    """The high nibble of the fixed header's first byte (MQTT 5.0 section 2.1.2)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15  # MQTT 5.0 only; reserved (refused) in 3.1 and 3.1.1


class ProtocolLevel(IntEnum):
    """The CONNECT packet's protocol level byte."""

    MQTT_3_1 = 3
    MQTT_3_1_1 = 4
    MQTT_5 = 5


PROTOCOL_NAMES: Final[dict[ProtocolLevel, str]] = {
    ProtocolLevel.MQTT_3_1: "MQIsdp",
    ProtocolLevel.MQTT_3_1_1: "MQTT",
    ProtocolLevel.MQTT_5: "MQTT",
}
"""The protocol name each level must come with in CONNECT."""

FLAGS_REQUIRED: Final[dict[PacketType, int]] = {
    # MQTT 3.1.1 section 2.2.2 / 5.0 section 2.1.3: these three carry 0b0010, every other
    # packet but PUBLISH carries 0; anything else is a malformed packet.
    PacketType.PUBREL: 0b0010,
    PacketType.SUBSCRIBE: 0b0010,
    PacketType.UNSUBSCRIBE: 0b0010,
}

PUBLISH_FLAG_DUP: Final = 0b1000
PUBLISH_FLAG_RETAIN: Final = 0b0001
PUBLISH_QOS_SHIFT: Final = 1
QOS_MAX: Final = 2

# CONNECT flags (MQTT 5.0 section 3.1.2.3).
CONNECT_FLAG_USERNAME: Final = 0x80
CONNECT_FLAG_PASSWORD: Final = 0x40
CONNECT_FLAG_WILL_RETAIN: Final = 0x20
CONNECT_FLAG_WILL_QOS_SHIFT: Final = 3
CONNECT_FLAG_WILL: Final = 0x04
CONNECT_FLAG_CLEAN_START: Final = 0x02
CONNECT_FLAG_RESERVED: Final = 0x01

# SUBSCRIBE options (MQTT 5.0 section 3.8.3.1).
SUBSCRIBE_OPTION_QOS_MASK: Final = 0x03
SUBSCRIBE_OPTION_NO_LOCAL: Final = 0x04
SUBSCRIBE_OPTION_RETAIN_AS_PUBLISHED: Final = 0x08
SUBSCRIBE_OPTION_RETAIN_HANDLING_SHIFT: Final = 4
SUBSCRIBE_OPTION_RESERVED_V5: Final = 0xC0
SUBSCRIBE_OPTION_RESERVED_V3: Final = 0xFC
RETAIN_HANDLING_MAX: Final = 2

# ---- limits -------------------------------------------------------------------------

VARINT_BYTES_MAX: Final = 4
"""A Variable Byte Integer has at most 4 bytes; a fifth continuation is malformed."""

VARINT_MAX: Final = 268_435_455
"""The largest Variable Byte Integer (0xFF 0xFF 0xFF 0x7F), so the largest remaining length."""

FIXED_HEADER_BYTES_MAX: Final = 1 + VARINT_BYTES_MAX

PACKET_BYTES_MAX_DEFAULT: Final = 1_048_576
"""The default maximum packet size (whole packet, fixed header included, as MQTT 5's
Maximum Packet Size counts it). Each connection may set its own, up to
PACKET_BYTES_MAX_LIMIT; a remaining length over it is refused before its body is
buffered."""

PACKET_BYTES_MAX_LIMIT: Final = FIXED_HEADER_BYTES_MAX + VARINT_MAX
"""The largest packet the wire can describe (the spec's 256 MB)."""

PACKET_BYTES_MIN: Final = 2
"""The smallest packet (PINGREQ); a configured maximum below it is a programmer error."""

STRING_BYTES_MAX: Final = 0xFFFF
"""UTF-8 strings and binary data carry a two-byte length (MQTT 5.0 sections 1.5.4, 1.5.6)."""

CLIENT_ID_BYTES_MAX_V31: Final = 23
"""MQTT 3.1 allows 1 to 23 bytes of client identifier; longer is "identifier rejected"."""

TOPIC_LEVELS_MAX: Final = 128
"""Topic names and filters with more `/`-separated levels are refused (a routing key is
matched level by level; the spec sets no bound, RabbitMQ's topic exchange neither)."""

SUBSCRIPTIONS_PER_PACKET_MAX: Final = 256
"""Topic filters in one SUBSCRIBE or UNSUBSCRIBE (each costs a binding); more is refused."""

USER_PROPERTIES_MAX: Final = 128
"""User Property pairs in one property list (a packet's, or a will's)."""

SUBSCRIPTION_IDENTIFIERS_MAX: Final = 64
"""Subscription Identifiers in one PUBLISH (one per matching subscription of a session)."""

PROTOCOL_NAME_BYTES_MAX: Final = 6
"""The longest protocol name we accept ("MQIsdp"); anything longer is not MQTT."""
