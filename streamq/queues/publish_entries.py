"""A stream-protocol Publish frame as chunk entries, for a stream stored in chunks.

Owns the parse of a Publish payload (protocol version 1, or 2 with filter values) into
the entries a version-2 log stores (docs/log-format.md, "Format version 2"): a simple
message as sent, a sub-entry batch as sent (compressed or not: kept so, its framing and,
decompressed once to check its messages), each with its filter value; and the deduplication
of a publisher with a reference (an id at or below the reference's sequence is a
duplicate: confirmed, not stored). Errors carry the texts of the C parser of version-1
logs (`_streamwire.encode_publish`). It does no I/O.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from streamq.log import chunk
from streamq.log.chunk import SimpleEntry, SubBatch
from streamq.queues import sub_entries

FILTER_VALUE_BYTES_MAX: Final = chunk.FILTER_VALUE_BYTES_MAX  # the protocol's i16
_COUNT: Final = struct.Struct(">i")
_ID: Final = struct.Struct(">Q")
_FILTER_LENGTH: Final = struct.Struct(">h")
_SIZE: Final = struct.Struct(">I")
_BATCH: Final = struct.Struct(">BHII")


class PublishEntries(NamedTuple):
    entries: list[chunk.Entry]  # what to store, duplicates left out
    count: int  # type: ignore[assignment]  # messages in the frame (a batch is one)
    records: int  # offsets the entries take
    ids: bytes  # every message's publishing id, u64 big-endian, in frame order
    sequence: int  # the reference's new sequence (-1: still none)


def parse_publish(
    version: int, payload: bytes | memoryview, sequence: int, dedup: bool, entry_bytes_max: int
) -> PublishEntries:
    """The entries of a Publish `payload` (from its message count on). `sequence`: the
    reference's highest stored id (-1: none), used when `dedup`. Raises ValueError for a
    malformed payload or an entry over `entry_bytes_max`, parsing all before anything
    is stored."""
    if version not in (1, 2):
        raise ValueError("unsupported Publish version")
    view = memoryview(payload)
    if len(view) < _COUNT.size:
        raise ValueError("truncated message count")
    (count,) = _COUNT.unpack_from(view)
    if count < 0:
        raise ValueError("negative message count")
    at = _COUNT.size
    entries: list[chunk.Entry] = []
    ids = bytearray()
    records = 0
    for _ in range(count):
        if len(view) - at < _ID.size:
            raise ValueError("truncated publishing id")
        ids += view[at : at + _ID.size]
        (publishing_id,) = _ID.unpack_from(view, at)
        at += _ID.size
        value = b""
        if version >= 2:
            value, at = _filter_value(view, at)
        entry, at = _entry(view, at, value)
        if dedup:
            if sequence >= 0 and publishing_id <= sequence:
                continue
            sequence = publishing_id
        if len(entry.data) + chunk.BATCH_HEADER.size > entry_bytes_max:
            raise ValueError("message larger than the log's record size limit")
        entries.append(entry)
        records += entry.records if isinstance(entry, SubBatch) else 1
    if at != len(view):
        raise ValueError("bytes after the last message")
    return PublishEntries(entries, count, records, bytes(ids), sequence)


def _filter_value(view: memoryview, at: int) -> tuple[bytes, int]:
    if len(view) - at < _FILTER_LENGTH.size:
        raise ValueError("truncated filter value")
    (length,) = _FILTER_LENGTH.unpack_from(view, at)
    at += _FILTER_LENGTH.size
    if length < -1:
        raise ValueError("negative filter value length")
    if length <= 0:
        return b"", at
    if len(view) - at < length:
        raise ValueError("truncated filter value")
    return bytes(view[at : at + length]), at + length


def _entry(view: memoryview, at: int, value: bytes) -> tuple[chunk.Entry, int]:
    if len(view) - at < 1:
        raise ValueError("truncated message")
    if not view[at] & chunk.BATCH_FLAG:
        if len(view) - at < _SIZE.size:
            raise ValueError("truncated message size")
        (size,) = _SIZE.unpack_from(view, at)
        at += _SIZE.size
        if size > chunk.SIMPLE_ENTRY_BYTES_MAX or len(view) - at < size:
            raise ValueError("truncated message")
        return SimpleEntry(bytes(view[at : at + size]), value), at + size
    if len(view) - at < _BATCH.size:
        raise ValueError("truncated sub-entry batch")
    kind, records, plain, length = _BATCH.unpack_from(view, at)
    at += _BATCH.size
    compression = (kind & chunk.COMPRESSION_MASK) >> chunk.COMPRESSION_SHIFT
    if compression > chunk.COMPRESSION_MAX or kind & chunk.BATCH_RESERVED_MASK:
        raise ValueError(f"unknown sub-entry batch compression {compression}")
    if len(view) - at < length:
        raise ValueError("truncated sub-entry batch")
    data = bytes(view[at : at + length])
    if compression == chunk.COMPRESSION_NONE:
        _check_messages(data, records)
        plain = length
    else:  # readers decompress it: it must, to exactly its messages
        _check_messages(sub_entries.decompress(compression, data, plain), records)
    return SubBatch(data, records, compression, plain, value), at + length


def _check_messages(data: bytes, records: int) -> None:
    """An uncompressed batch's data is exactly `records` messages `u32 size | bytes`."""
    at = 0
    for _ in range(records):
        if (
            len(data) - at < _SIZE.size
            or len(data) - at - _SIZE.size < _SIZE.unpack_from(data, at)[0]
        ):
            raise ValueError("sub-entry batch does not hold its messages")
        at += _SIZE.size + _SIZE.unpack_from(data, at)[0]
    if at != len(data) or records == 0:
        raise ValueError("sub-entry batch does not hold its messages")
