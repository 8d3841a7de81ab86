"""MQTT 5.0 properties (section 2.2.2): every identifier, its type, where it may appear.

This module owns the property table (`SPECS`, the spec's table 2-4), the immutable
`Properties` value and its decoding and encoding. Refusals, as the spec words them: an
unknown identifier, or one not valid for its packet, is a malformed packet (2.2.2.2); a
property present twice (all but User Property, and Subscription Identifier in PUBLISH),
a flag other than 0 or 1, a zero Receive Maximum, Maximum Packet Size or Subscription
Identifier, or Authentication Data without an Authentication Method, is a protocol error;
a zero Topic Alias is "Topic Alias invalid"; too many user properties or subscription
identifiers for our limits is "Quota exceeded".
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, Final

from mqtt_gateway.codec.constants import (
    SUBSCRIPTION_IDENTIFIERS_MAX,
    USER_PROPERTIES_MAX,
    PacketType,
    ProtocolLevel,
)
from mqtt_gateway.codec.errors import (
    LimitExceeded,
    MalformedPacket,
    MqttCodecError,
    ProtocolError,
    TopicAliasInvalid,
)
from mqtt_gateway.codec.wire import Reader, Writer

WILL: Final = 0
"""The property context of a CONNECT's will properties (not a packet type: types are 1-15)."""


class PropertyId(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


class PropertyType(Enum):
    BYTE = "Byte"
    TWO_BYTE = "Two Byte Integer"
    FOUR_BYTE = "Four Byte Integer"
    VARINT = "Variable Byte Integer"
    UTF8 = "UTF-8 Encoded String"
    BINARY = "Binary Data"
    UTF8_PAIR = "UTF-8 String Pair"


UserProperty = tuple[str, str]
PropertyValue = int | str | bytes | UserProperty


@dataclass(frozen=True, slots=True)
class Properties:
    """One packet's (or a will's) properties; None or () where absent. Repeated ones keep
    their order on the wire."""

    payload_format_indicator: int | None = None
    message_expiry_interval_s: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval_s: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive_s: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval_s: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[UserProperty, ...] = field(default=())
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None


NO_PROPERTIES: Final = Properties()

P = PacketType
_PUBLISH_AND_WILL: Final = frozenset({P.PUBLISH, WILL})
_ACKS: Final = frozenset({P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP, P.SUBACK, P.UNSUBACK})
_REASON_STRING: Final = _ACKS | {P.CONNACK, P.DISCONNECT, P.AUTH}
_USER_PROPERTY: Final = _REASON_STRING | {P.CONNECT, P.PUBLISH, WILL, P.SUBSCRIBE, P.UNSUBSCRIBE}


@dataclass(frozen=True, slots=True)
class PropertySpec:
    """One row of the spec's table 2-4, with the `Properties` field it fills."""

    id: PropertyId
    name: str
    type: PropertyType
    contexts: frozenset[int]
    repeatable_in: frozenset[int] = frozenset()
    flag: bool = False  # a Byte whose only values are 0 and 1
    non_zero: bool = False


_FIELD_NAMES: Final = {
    # The field of `Properties` is the identifier's name, but for units (STYLE.md section 4)
    # and the two repeatable ones, which hold tuples.
    PropertyId.MESSAGE_EXPIRY_INTERVAL: "message_expiry_interval_s",
    PropertyId.SESSION_EXPIRY_INTERVAL: "session_expiry_interval_s",
    PropertyId.SERVER_KEEP_ALIVE: "server_keep_alive_s",
    PropertyId.WILL_DELAY_INTERVAL: "will_delay_interval_s",
    PropertyId.SUBSCRIPTION_IDENTIFIER: "subscription_identifiers",
    PropertyId.USER_PROPERTY: "user_properties",
}


def _spec(
    id_: PropertyId,
    type_: PropertyType,
    contexts: frozenset[int],
    repeatable_in: frozenset[int] = frozenset(),
    *,
    flag: bool = False,
    non_zero: bool = False,
) -> PropertySpec:
    name = _FIELD_NAMES.get(id_, id_.name.lower())
    return PropertySpec(id_, name, type_, contexts, repeatable_in, flag, non_zero)


Id, T = PropertyId, PropertyType
_CONNECT: Final = frozenset({P.CONNECT})
_CONNACK: Final = frozenset({P.CONNACK})
_CONNECT_CONNACK: Final = frozenset({P.CONNECT, P.CONNACK})
_AUTHS: Final = frozenset({P.CONNECT, P.CONNACK, P.AUTH})
_SESSION: Final = frozenset({P.CONNECT, P.CONNACK, P.DISCONNECT})
SPECS: Final[dict[int, PropertySpec]] = {
    spec.id: spec
    for spec in (
        _spec(Id.PAYLOAD_FORMAT_INDICATOR, T.BYTE, _PUBLISH_AND_WILL, flag=True),
        _spec(Id.MESSAGE_EXPIRY_INTERVAL, T.FOUR_BYTE, _PUBLISH_AND_WILL),
        _spec(Id.CONTENT_TYPE, T.UTF8, _PUBLISH_AND_WILL),
        _spec(Id.RESPONSE_TOPIC, T.UTF8, _PUBLISH_AND_WILL),
        _spec(Id.CORRELATION_DATA, T.BINARY, _PUBLISH_AND_WILL),
        # Repeatable in PUBLISH only: "It is a Protocol Error to include the Subscription
        # Identifier more than once" in SUBSCRIBE (3.8.2.1.2).
        _spec(
            Id.SUBSCRIPTION_IDENTIFIER,
            T.VARINT,
            frozenset({P.PUBLISH, P.SUBSCRIBE}),
            frozenset({P.PUBLISH}),
            non_zero=True,
        ),
        _spec(Id.SESSION_EXPIRY_INTERVAL, T.FOUR_BYTE, _SESSION),
        _spec(Id.ASSIGNED_CLIENT_IDENTIFIER, T.UTF8, _CONNACK),
        _spec(Id.SERVER_KEEP_ALIVE, T.TWO_BYTE, _CONNACK),
        _spec(Id.AUTHENTICATION_METHOD, T.UTF8, _AUTHS),
        _spec(Id.AUTHENTICATION_DATA, T.BINARY, _AUTHS),
        _spec(Id.REQUEST_PROBLEM_INFORMATION, T.BYTE, _CONNECT, flag=True),
        _spec(Id.WILL_DELAY_INTERVAL, T.FOUR_BYTE, frozenset({WILL})),
        _spec(Id.REQUEST_RESPONSE_INFORMATION, T.BYTE, _CONNECT, flag=True),
        _spec(Id.RESPONSE_INFORMATION, T.UTF8, _CONNACK),
        _spec(Id.SERVER_REFERENCE, T.UTF8, frozenset({P.CONNACK, P.DISCONNECT})),
        _spec(Id.REASON_STRING, T.UTF8, _REASON_STRING),
        _spec(Id.RECEIVE_MAXIMUM, T.TWO_BYTE, _CONNECT_CONNACK, non_zero=True),
        _spec(Id.TOPIC_ALIAS_MAXIMUM, T.TWO_BYTE, _CONNECT_CONNACK),
        _spec(Id.TOPIC_ALIAS, T.TWO_BYTE, frozenset({P.PUBLISH}), non_zero=True),
        _spec(Id.MAXIMUM_QOS, T.BYTE, _CONNACK, flag=True),
        _spec(Id.RETAIN_AVAILABLE, T.BYTE, _CONNACK, flag=True),
        _spec(Id.USER_PROPERTY, T.UTF8_PAIR, _USER_PROPERTY, _USER_PROPERTY),
        _spec(Id.MAXIMUM_PACKET_SIZE, T.FOUR_BYTE, _CONNECT_CONNACK, non_zero=True),
        _spec(Id.WILDCARD_SUBSCRIPTION_AVAILABLE, T.BYTE, _CONNACK, flag=True),
        _spec(Id.SUBSCRIPTION_IDENTIFIER_AVAILABLE, T.BYTE, _CONNACK, flag=True),
        _spec(Id.SHARED_SUBSCRIPTION_AVAILABLE, T.BYTE, _CONNACK, flag=True),
    )
}
"""Every property of MQTT 5.0 section 2.2.2.2, by identifier."""

_REPEATED_FIELDS: Final = frozenset({"subscription_identifiers", "user_properties"})
_COUNT_MAX: Final = {
    "subscription_identifiers": SUBSCRIPTION_IDENTIFIERS_MAX,
    "user_properties": USER_PROPERTIES_MAX,
}

_READERS: Final[dict[PropertyType, Callable[[Reader, str], PropertyValue]]] = {
    T.BYTE: Reader.u8,
    T.TWO_BYTE: Reader.u16,
    T.FOUR_BYTE: Reader.u32,
    T.VARINT: Reader.varint,
    T.UTF8: Reader.string,
    T.BINARY: Reader.binary,
    T.UTF8_PAIR: lambda reader, what: (reader.string(what), reader.string(what)),
}


def _check_value(spec: PropertySpec, value: PropertyValue) -> None:
    if spec.flag and value not in (0, 1):
        raise ProtocolError(f"{spec.name}: {value!r} is not 0 or 1")
    if spec.non_zero and value == 0:
        if spec.id == PropertyId.TOPIC_ALIAS:
            raise TopicAliasInvalid("topic alias 0 (MQTT-3.3.2-8)")
        raise ProtocolError(f"{spec.name}: 0 is not allowed")


def decode_properties(reader: Reader, context: int) -> Properties:
    """Read a property length and the properties it covers, for packet type `context`
    (or WILL). Raises `MalformedPacket`, `ProtocolError` or a subclass (module docstring)."""
    body = reader.sub_reader(reader.varint("property length"), "properties")
    if not body.remaining:
        return NO_PROPERTIES
    values: dict[str, PropertyValue] = {}
    repeated: dict[str, list[PropertyValue]] = {}
    while body.remaining:
        identifier = body.varint("property identifier")
        spec = SPECS.get(identifier)
        if spec is None or context not in spec.contexts:
            raise MalformedPacket(f"property 0x{identifier:02x} not valid here")
        value = _READERS[spec.type](body, spec.name)
        _check_value(spec, value)
        if spec.name in _REPEATED_FIELDS:
            items = repeated.setdefault(spec.name, [])
            if items and context not in spec.repeatable_in:
                raise ProtocolError(f"{spec.name} more than once")
            if len(items) >= _COUNT_MAX[spec.name]:
                raise LimitExceeded(f"more than {_COUNT_MAX[spec.name]} {spec.name}")
            items.append(value)
        elif spec.name in values:
            raise ProtocolError(f"{spec.name} more than once")
        else:
            values[spec.name] = value
    if "authentication_data" in values and "authentication_method" not in values:
        raise ProtocolError("authentication data without an authentication method")
    fields: dict[str, object] = {**values, **{k: tuple(v) for k, v in repeated.items()}}
    return Properties(**fields)  # type: ignore[arg-type]  # names and types from SPECS


def _int(value: PropertyValue) -> int:
    assert isinstance(value, int), value
    return value


def _str(value: PropertyValue) -> str:
    assert isinstance(value, str), value
    return value


def _bytes(value: PropertyValue) -> bytes:
    assert isinstance(value, bytes), value
    return value


def _write_pair(writer: Writer, value: PropertyValue, what: str) -> None:
    assert isinstance(value, tuple), value
    writer.string(value[0], what)
    writer.string(value[1], what)


_WRITERS: Final[dict[PropertyType, Callable[[Writer, PropertyValue, str], None]]] = {
    T.BYTE: lambda writer, value, _: writer.u8(_int(value)),
    T.TWO_BYTE: lambda writer, value, _: writer.u16(_int(value)),
    T.FOUR_BYTE: lambda writer, value, _: writer.u32(_int(value)),
    T.VARINT: lambda writer, value, _: writer.varint(_int(value)),
    T.UTF8: lambda writer, value, what: writer.string(_str(value), what),
    T.BINARY: lambda writer, value, what: writer.binary(_bytes(value), what),
    T.UTF8_PAIR: _write_pair,
}


def encode_properties(properties: Properties, context: int, writer: Writer) -> None:
    """Write a property length and `properties`, in identifier order. Raises `ValueError`
    for a property not valid in `context`, a value the decoder would refuse, or too many
    repeated ones: the same rules, so whatever we send, a peer's codec like ours accepts."""
    if properties.authentication_data is not None and properties.authentication_method is None:
        raise ValueError("authentication data without an authentication method")
    body = Writer(bytearray())
    if properties is not NO_PROPERTIES:
        # One C call reads every field; only the present ones cost a Python call.
        for spec, value in zip(_SPEC_LIST, _read_all(properties), strict=True):
            if value is not None and value != ():
                _encode_one(value, spec, context, body)
    writer.varint(len(body.out))
    writer.out += body.out


_SPEC_LIST: Final = tuple(SPECS.values())
_read_all: Final = operator.attrgetter(*(spec.name for spec in _SPEC_LIST))


def _encode_one(value: Any, spec: PropertySpec, context: int, body: Writer) -> None:
    """Write one present property (a repeated one's every value)."""
    if context not in spec.contexts:
        raise ValueError(f"{spec.name} is not valid in packet context {context}")
    items = value if spec.name in _REPEATED_FIELDS else (value,)
    if len(items) > 1 and context not in spec.repeatable_in:
        raise ValueError(f"{spec.name} may appear only once here")
    if len(items) > _COUNT_MAX.get(spec.name, 1):
        raise ValueError(f"more than {_COUNT_MAX[spec.name]} {spec.name}")
    for item in items:
        try:
            _check_value(spec, item)
        except MqttCodecError as exc:
            raise ValueError(str(exc)) from exc
        body.varint(spec.id)
        _WRITERS[spec.type](body, item, spec.name)


def read_properties(reader: Reader, context: int, level: ProtocolLevel) -> Properties:
    """`decode_properties` in MQTT 5.0; MQTT 3.x packets have none."""
    if level is ProtocolLevel.MQTT_5:
        return decode_properties(reader, context)
    return NO_PROPERTIES


def write_properties(
    properties: Properties, context: int, level: ProtocolLevel, writer: Writer
) -> None:
    """`encode_properties` in MQTT 5.0; `ValueError` for properties at a 3.x level."""
    if level is ProtocolLevel.MQTT_5:
        encode_properties(properties, context, writer)
    elif properties != NO_PROPERTIES:
        raise ValueError(f"MQTT level {level} packets carry no properties")
