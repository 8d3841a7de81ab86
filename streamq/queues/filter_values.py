"""Stream-protocol filter values and publisher references longer than a record field holds.

Owns the one rule that lets the stream protocol's strings reach their protocol limit
(an int16 length: 32,767 bytes) while a native record keeps its one-byte length fields
(docs/log-format.md, unchanged): a value of at most RECORD_FIELD_BYTES_MAX bytes is
stored as it is; a longer one as its *stored form*, `sha256:` and the SHA-256 of the
value in hex (71 bytes). Matching is still exact: whoever compares a long value with a
stored one (a subscription's filter, an AMQP consumer's `x-stream-filter`, a
QueryPublisherSequence) compares its stored form too (`forms`). The stored form is what
AMQP consumers and the Spark source see as such a record's `x-stream-filter-value`.

`shorten_publish` rewrites a Publish v2 payload whose filter values are too long for the
C parser (`_streamwire`), leaving everything else byte for byte; it runs only for such a
frame (the C parser refuses it first), so the common path pays nothing. It parses in
Python: O(messages) per frame, a copy of the payload.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Final

RECORD_FIELD_BYTES_MAX: Final = 255  # a native record's exchange and routing key fields
STORED_PREFIX: Final = b"sha256:"
LONG_FILTER_TEXT: Final = "filter value longer than 255 bytes"  # _streamwire's refusal
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_U32: Final = struct.Struct(">I")
_SUB_ENTRY_HEAD_BYTES: Final = 1 + 2 + 4 + 4  # flags, count, uncompressed, size


def stored(value: bytes) -> bytes:
    """What a record stores for a filter value or publisher reference."""
    if len(value) <= RECORD_FIELD_BYTES_MAX:
        return value
    return STORED_PREFIX + hashlib.sha256(value).hexdigest().encode()


def forms(value: bytes) -> tuple[bytes, ...]:
    """The forms a record may hold `value` in: itself, and its stored form when long (a
    0-9-1 message's `x-stream-filter-value` header holds a long value as it is)."""
    short = stored(value)
    return (value,) if short == value else (value, short)


def shorten_publish(payload: bytes | memoryview) -> bytes:
    """A Publish v2 payload (from its message count on) with every filter value over
    RECORD_FIELD_BYTES_MAX bytes replaced by its stored form. Raises ValueError for a
    payload that does not parse (the C parser then says what is wrong with it)."""
    data = memoryview(payload)
    try:
        (count,) = _I32.unpack_from(data, 0)
        out = bytearray(data[:4])
        at = 4
        for _ in range(count):
            start = at
            at += 8  # publishing id
            (length,) = _I16.unpack_from(data, at)
            at += 2
            value = bytes(data[at : at + max(length, 0)])
            if len(value) != max(length, 0):
                raise ValueError("truncated filter value")
            at += len(value)
            if length > RECORD_FIELD_BYTES_MAX:
                short = stored(value)
                out += data[start : start + 8]
                out += _I16.pack(len(short)) + short
            else:
                out += data[start:at]
            entry_end = at + _entry_bytes(data, at)
            if entry_end > len(data):
                raise ValueError("truncated message")
            out += data[at:entry_end]
            at = entry_end
    except (struct.error, IndexError):
        raise ValueError("truncated message") from None
    if count < 0 or at != len(data):
        raise ValueError("bad message count or trailing bytes")
    return bytes(out)


def _entry_bytes(data: memoryview, at: int) -> int:
    """The size of the simple entry or sub-entry batch at `at`, its header included."""
    size: int
    if data[at] & 0x80 == 0:
        (size,) = _U32.unpack_from(data, at)
        return 4 + size
    (size,) = _U32.unpack_from(data, at + _SUB_ENTRY_HEAD_BYTES - 4)
    return _SUB_ENTRY_HEAD_BYTES + size
