"""AMQP 1.0 messages in stream logs: the native-record mark and the 0-9-1 <-> 1.0 conversion.

A message published by a stream-protocol client is stored verbatim as one record whose
`properties` field is `NATIVE_MARK` followed by the u64 publishing id (docs/log-format.md);
every other record holds AMQP 0-9-1 basic properties in wire encoding. This module owns
that mark and the conversion between the two message models, specified in the "Message
conversion" section of docs/stream-protocol.md. Pure and stdlib only: the Spark source
imports it.
"""

from __future__ import annotations

import struct
from typing import Final

from streamq.log.format import Record

# An AMQP 0-9-1 property-flags word with only bit 1 set: a reserved bit no 0-9-1 client sends.
NATIVE_MARK: Final = b"\x00\x02"
_PUBLISHING_ID: Final = struct.Struct("<Q")


def is_native(properties: bytes) -> bool:
    """Whether a record's properties field marks a stream-native (AMQP 1.0) record."""
    return properties[:2] == NATIVE_MARK


def native_properties(publishing_id: int) -> bytes:
    """The properties field of a native record published with `publishing_id`."""
    return NATIVE_MARK + _PUBLISHING_ID.pack(publishing_id)


def to_amqp10(exchange: bytes, routing_key: bytes, properties: bytes, body: bytes) -> bytes:
    """An AMQP 0-9-1 record -> one AMQP 1.0 message, as RabbitMQ converts for stream clients."""
    raise NotImplementedError


def to_amqp091(stream: str, record: Record) -> tuple[bytes, bytes, bytes, bytes]:
    """A native record -> (exchange, routing_key, 0-9-1 properties, body) for 0-9-1 consumers."""
    raise NotImplementedError
