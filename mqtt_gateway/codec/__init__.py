"""The sans-IO MQTT codec (3.1 "MQIsdp", 3.1.1 and 5.0): bytes <-> typed packets.

No sockets, asyncio, clock or global mutable state. Modules, by what they own:
`constants` (packet types, levels, flags, every limit), `reason_codes`, `errors` (the one
error family, each with its reason code), `wire` (data representations), `topics` (topic
name and filter syntax, `$share`), `properties` (MQTT 5 properties), `packets` (the
dataclasses), `connect`, `publish`, `subscribe`, `control` (each family's decoders and
encoders) and `framing` (fixed header, `Decoder.feed`, `decode_packet`, `encode`).
"""

from __future__ import annotations

from mqtt_gateway.codec.constants import PACKET_BYTES_MAX_DEFAULT, PacketType, ProtocolLevel
from mqtt_gateway.codec.errors import (
    ClientIdentifierNotValid,
    LimitExceeded,
    MalformedPacket,
    MqttCodecError,
    PacketTooLarge,
    ProtocolError,
    TopicAliasInvalid,
    TopicFilterInvalid,
    TopicNameInvalid,
    UnsupportedProtocolVersion,
)
from mqtt_gateway.codec.framing import Decoder, decode_packet, encode
from mqtt_gateway.codec.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from mqtt_gateway.codec.properties import NO_PROPERTIES, Properties, PropertyId
from mqtt_gateway.codec.reason_codes import ConnackReturnCode, ReasonCode
from mqtt_gateway.codec.topics import (
    SharedFilter,
    check_topic_filter,
    check_topic_name,
    parse_shared,
)

__all__ = [
    "NO_PROPERTIES",
    "PACKET_BYTES_MAX_DEFAULT",
    "Auth",
    "ClientIdentifierNotValid",
    "ConnAck",
    "ConnackReturnCode",
    "Connect",
    "Decoder",
    "Disconnect",
    "LimitExceeded",
    "MalformedPacket",
    "MqttCodecError",
    "Packet",
    "PacketTooLarge",
    "PacketType",
    "PingReq",
    "PingResp",
    "Properties",
    "PropertyId",
    "ProtocolError",
    "ProtocolLevel",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "ReasonCode",
    "SharedFilter",
    "SubAck",
    "Subscribe",
    "Subscription",
    "TopicAliasInvalid",
    "TopicFilterInvalid",
    "TopicNameInvalid",
    "UnsubAck",
    "Unsubscribe",
    "UnsupportedProtocolVersion",
    "Will",
    "check_topic_filter",
    "check_topic_name",
    "decode_packet",
    "encode",
    "parse_shared",
]
