"""The gateway's view of a stream's storage: C3's calls, with a stand-in until they land.

Owns the one place that calls `StreamQueue.append_publish`, `read_chunk` and the
publisher sequences, so that the rest of the gateway never asks whether the storage side
has them. Where `StreamQueue` lacks them (before branch i23-store is merged) a plain Python
stand-in does the same over `StreamQueue.append`/`read`: correct, not fast. It knows no
sockets and no frames beyond the Publish payload layout that C3 specifies.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final, NamedTuple

from streamq.queues.stream import StreamQueue

NATIVE_MARK: Final = b"\x00\x02"
_ID: Final = struct.Struct(">Q")
_I32: Final = struct.Struct(">i")
_I16: Final = struct.Struct(">h")
_ENTRY: Final = struct.Struct(">I")
CHUNK_HEADER: Final = struct.Struct(">BBHIqQQiIIB3x")
CHUNK_MAGIC_VERSION: Final = 0x50


class BadPublish(ValueError):
    """A Publish payload that does not parse."""


class PublishResult(NamedTuple):
    count: int  # type: ignore[assignment]  # C3's field name shadows tuple.count
    appended: int
    next_offset: int
    ids: bytes


class ChunkFilter(NamedTuple):
    values: frozenset[bytes]
    match_unfiltered: bool


class Chunk(NamedTuple):
    first_offset: int
    next_offset: int
    records: int
    data: bytes


def publisher_sequence(stream: StreamQueue, reference: bytes) -> int:
    """The highest publishing id stored for `reference`, 0 if none."""
    publishers = getattr(stream, "publishers", None)
    if publishers is not None:
        return int(publishers.sequence(reference))
    return _sequences(stream).get(reference, 0)


def append_publish(
    stream: StreamQueue, reference: bytes, version: int, payload: memoryview, timestamp_ms: int
) -> PublishResult:
    """Append a Publish frame's messages (C3). Raises BadPublish (a ValueError)."""
    native = getattr(stream, "append_publish", None)
    if native is not None:
        result = native(reference, version, payload, timestamp_ms)
        return PublishResult(result.count, result.appended, result.next_offset, result.ids)
    return _append_publish(stream, reference, version, payload, timestamp_ms)


def read_chunk(
    stream: StreamQueue, offset: int, records_max: int, bytes_max: int, filter: ChunkFilter | None
) -> Chunk | None:
    """One chunk of durable records from `offset` (C3), None when there is none."""
    native = getattr(stream, "read_chunk", None)
    if native is not None:
        native_filter = None
        if filter is not None:
            from streamq.queues import stream as stream_module  # noqa: PLC0415

            native_filter = stream_module.ChunkFilter(filter.values, filter.match_unfiltered)  # type: ignore[attr-defined]  # C3, on branch i23-store
        chunk = native(offset, records_max, bytes_max, native_filter)
        if chunk is None:
            return None
        return Chunk(chunk.first_offset, chunk.next_offset, chunk.records, chunk.data)
    return _read_chunk(stream, offset, records_max, bytes_max, filter)


# -- the stand-in ------------------------------------------------------------------------

_SEQUENCES: dict[int, dict[bytes, int]] = {}


def _sequences(stream: StreamQueue) -> dict[bytes, int]:
    return _SEQUENCES.setdefault(id(stream.log), {})


def _append_publish(
    stream: StreamQueue, reference: bytes, version: int, payload: memoryview, timestamp_ms: int
) -> PublishResult:
    messages = _parse(payload, version)
    sequences = _sequences(stream)
    sequence = sequences.get(reference, 0) if reference else -1
    appended = 0
    for publishing_id, filter_value, body in messages:
        if reference and publishing_id <= sequence:
            continue
        properties = NATIVE_MARK + struct.pack("<Q", publishing_id)
        stream.append(reference, filter_value, properties, body, timestamp_ms)
        appended += 1
        if reference:
            sequence = publishing_id
    if reference and appended:
        sequences[reference] = sequence
    ids = b"".join(_ID.pack(m[0]) for m in messages)
    return PublishResult(len(messages), appended, stream.log.next_offset, ids)


def _parse(payload: memoryview, version: int) -> list[tuple[int, bytes, bytes]]:
    try:
        (count,) = _I32.unpack_from(payload, 0)
        position = 4
        messages = []
        for _ in range(count):
            (publishing_id,) = _ID.unpack_from(payload, position)
            position += 8
            filter_value = b""
            if version == 2:
                (size,) = _I16.unpack_from(payload, position)
                position += 2
                if size > 0:
                    filter_value = bytes(payload[position : position + size])
                    position += size
            (size,) = _I32.unpack_from(payload, position)
            position += 4
            if size < 0 or position + size > len(payload):
                raise BadPublish("truncated message")
            messages.append(
                (publishing_id, filter_value, bytes(payload[position : position + size]))
            )
            position += size
    except struct.error as exc:
        raise BadPublish(str(exc)) from None
    if count < 0 or position != len(payload):
        raise BadPublish("bad message count or trailing bytes")
    return messages


def _read_chunk(
    stream: StreamQueue, offset: int, records_max: int, bytes_max: int, filter: ChunkFilter | None
) -> Chunk | None:
    records = stream.read(offset)
    if not records:
        return None
    data = bytearray()
    first = records[0].offset
    taken = 0
    timestamp_ms = records[0].timestamp_ms
    next_offset = first
    for record in records[:records_max]:
        body = record.body if record.properties[:2] == NATIVE_MARK else _wrap(record.body)
        if filter is not None:
            value = record.routing_key if record.properties[:2] == NATIVE_MARK else b""
            keep = value in filter.values if value else filter.match_unfiltered
            if not keep:
                if taken:
                    break
                first = record.offset + 1
                next_offset = first
                continue
        if taken and len(data) + 4 + len(body) + CHUNK_HEADER.size > bytes_max:
            break
        data += _ENTRY.pack(len(body))
        data += body
        taken += 1
        next_offset = record.offset + 1
    if not taken:
        return Chunk(first, next_offset, 0, b"")
    header = CHUNK_HEADER.pack(
        CHUNK_MAGIC_VERSION, 0, taken, taken, timestamp_ms, 0, first,
        _signed(zlib.crc32(data)), len(data), 0, 0,
    )  # fmt: skip
    return Chunk(first, next_offset, taken, header + bytes(data))


def _signed(crc: int) -> int:
    return crc - (1 << 32) if crc >= 1 << 31 else crc


def _wrap(body: bytes) -> bytes:
    """An AMQP 1.0 message with one data section holding `body` (stand-in conversion)."""
    if len(body) < 256:
        return b"\x00\x53\x75\xa0" + bytes([len(body)]) + body
    return b"\x00\x53\x75\xb0" + struct.pack(">I", len(body)) + body
