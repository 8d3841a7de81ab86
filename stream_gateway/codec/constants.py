"""The stream protocol's numbers: command keys, versions, response codes, offset types.

Values are RabbitMQ's (`deps/rabbitmq_stream/docs/PROTOCOL.adoc` and
`rabbit_stream_core.erl`); this module owns no behaviour. A key's top bit marks a response:
`0x0007` is a subscribe request, `0x8007` its response.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

RESPONSE_FLAG: Final = 0x8000
"""The most significant bit of a key: 0 for a request or one-way command, 1 for a response."""

SIZE_BYTES: Final = 4
"""The frame's leading `uint32 size`, which counts the bytes after itself."""

HEADER_BYTES: Final = 4
"""`uint16 key | uint16 version`, the first bytes that `size` counts."""


class Key(IntEnum):
    """Command keys (the low 15 bits of a frame's key)."""

    DECLARE_PUBLISHER = 0x0001
    PUBLISH = 0x0002
    PUBLISH_CONFIRM = 0x0003
    PUBLISH_ERROR = 0x0004
    QUERY_PUBLISHER_SEQUENCE = 0x0005
    DELETE_PUBLISHER = 0x0006
    SUBSCRIBE = 0x0007
    DELIVER = 0x0008
    CREDIT = 0x0009
    STORE_OFFSET = 0x000A
    QUERY_OFFSET = 0x000B
    UNSUBSCRIBE = 0x000C
    CREATE = 0x000D
    DELETE = 0x000E
    METADATA = 0x000F
    METADATA_UPDATE = 0x0010
    PEER_PROPERTIES = 0x0011
    SASL_HANDSHAKE = 0x0012
    SASL_AUTHENTICATE = 0x0013
    TUNE = 0x0014
    OPEN = 0x0015
    CLOSE = 0x0016
    HEARTBEAT = 0x0017
    ROUTE = 0x0018
    PARTITIONS = 0x0019
    CONSUMER_UPDATE = 0x001A
    EXCHANGE_COMMAND_VERSIONS = 0x001B
    STREAM_STATS = 0x001C
    # RabbitMQ 3.13+: super streams over the protocol.
    CREATE_SUPER_STREAM = 0x001D
    DELETE_SUPER_STREAM = 0x001E


VERSION_1: Final = 1
VERSION_2: Final = 2

COMMAND_VERSIONS_MAX: Final[dict[Key, int]] = {
    # Publish v2 carries a filter value per message; Deliver v2 the committed offset.
    Key.PUBLISH: VERSION_2,
    Key.DELIVER: VERSION_2,
}
"""The highest version this codec decodes per key; every other key is version 1 only."""


class ResponseCode(IntEnum):
    """Response codes (PROTOCOL.adoc, "Response Codes")."""

    OK = 0x01
    STREAM_DOES_NOT_EXIST = 0x02
    SUBSCRIPTION_ID_ALREADY_EXISTS = 0x03
    SUBSCRIPTION_ID_DOES_NOT_EXIST = 0x04
    STREAM_ALREADY_EXISTS = 0x05
    STREAM_NOT_AVAILABLE = 0x06
    SASL_MECHANISM_NOT_SUPPORTED = 0x07
    AUTHENTICATION_FAILURE = 0x08
    SASL_ERROR = 0x09
    SASL_CHALLENGE = 0x0A
    SASL_AUTHENTICATION_FAILURE_LOOPBACK = 0x0B
    VIRTUAL_HOST_ACCESS_FAILURE = 0x0C
    UNKNOWN_FRAME = 0x0D
    FRAME_TOO_LARGE = 0x0E
    INTERNAL_ERROR = 0x0F
    ACCESS_REFUSED = 0x10
    PRECONDITION_FAILED = 0x11
    PUBLISHER_DOES_NOT_EXIST = 0x12
    NO_OFFSET = 0x13


class OffsetType(IntEnum):
    """A subscription's starting point. NONE appears only in a ConsumerUpdate response."""

    NONE = 0
    FIRST = 1
    LAST = 2
    NEXT = 3
    OFFSET = 4
    TIMESTAMP = 5


OFFSET_TYPES_WITH_VALUE: Final = frozenset({OffsetType.OFFSET, OffsetType.TIMESTAMP})
"""Offset types followed by 8 bytes: uint64 for OFFSET, int64 milliseconds for TIMESTAMP."""

SUBSCRIPTION_PROPERTY_FILTER_PREFIX: Final = "filter."
SUBSCRIPTION_PROPERTY_MATCH_UNFILTERED: Final = "match-unfiltered"
SUBSCRIPTION_PROPERTY_SINGLE_ACTIVE_CONSUMER: Final = "single-active-consumer"
SUBSCRIPTION_PROPERTY_NAME: Final = "name"

FRAME_MAX_DEFAULT: Final = 1_048_576
"""RabbitMQ's default `stream.frame_max` (1 MiB), offered in Tune."""

HEARTBEAT_S_DEFAULT: Final = 60
