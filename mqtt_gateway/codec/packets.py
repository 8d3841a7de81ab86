"""The fifteen MQTT control packets as immutable values (frozen, slotted dataclasses).

One class per packet type, the same for every protocol level: fields MQTT 3.1/3.1.1 lack
(properties, reason codes of acks) keep their defaults there, and encoding a value that a
level cannot carry is a `ValueError`. `reason_code` fields are plain ints on the wire:
`ReasonCode` members in 5.0, `ConnackReturnCode` or SUBACK return codes in 3.x.
This module owns the shapes only; decoding and encoding live in `connect`, `publish`,
`subscribe` and `control`, the envelope in `framing`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqtt_gateway.codec.constants import PacketType, ProtocolLevel
from mqtt_gateway.codec.properties import NO_PROPERTIES, Properties


@dataclass(frozen=True, slots=True)
class Will:
    """A CONNECT's will message."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connect:
    protocol_level: ProtocolLevel
    client_id: str
    clean_start: bool = True  # 3.x: "clean session"
    keep_alive_s: int = 0
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES
    type = PacketType.CONNECT


@dataclass(frozen=True, slots=True)
class ConnAck:
    reason_code: int = 0
    session_present: bool = False
    properties: Properties = NO_PROPERTIES
    type = PacketType.CONNACK


@dataclass(frozen=True, slots=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None  # present exactly when qos > 0
    properties: Properties = NO_PROPERTIES
    type = PacketType.PUBLISH


@dataclass(frozen=True, slots=True)
class PubAck:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES
    type = PacketType.PUBACK


@dataclass(frozen=True, slots=True)
class PubRec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES
    type = PacketType.PUBREC


@dataclass(frozen=True, slots=True)
class PubRel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES
    type = PacketType.PUBREL


@dataclass(frozen=True, slots=True)
class PubComp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES
    type = PacketType.PUBCOMP


PublishAck = PubAck | PubRec | PubRel | PubComp


@dataclass(frozen=True, slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE with its options (5.0 section 3.8.3.1)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES
    type = PacketType.SUBSCRIBE


@dataclass(frozen=True, slots=True)
class SubAck:
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = NO_PROPERTIES
    type = PacketType.SUBACK


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES
    type = PacketType.UNSUBSCRIBE


@dataclass(frozen=True, slots=True)
class UnsubAck:
    packet_id: int
    reason_codes: tuple[int, ...] = ()  # 3.x UNSUBACK has none
    properties: Properties = NO_PROPERTIES
    type = PacketType.UNSUBACK


@dataclass(frozen=True, slots=True)
class PingReq:
    type = PacketType.PINGREQ


@dataclass(frozen=True, slots=True)
class PingResp:
    type = PacketType.PINGRESP


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES
    type = PacketType.DISCONNECT


@dataclass(frozen=True, slots=True)
class Auth:
    """MQTT 5.0 only."""

    reason_code: int = 0
    properties: Properties = NO_PROPERTIES
    type = PacketType.AUTH


Packet = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)

PACKET_CLASSES: tuple[type[Packet], ...] = (
    Connect, ConnAck, Publish, PubAck, PubRec, PubRel, PubComp, Subscribe, SubAck,
    Unsubscribe, UnsubAck, PingReq, PingResp, Disconnect, Auth,
)  # fmt: skip
