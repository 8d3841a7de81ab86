"""Compressed sub-entry batches of the stream protocol: their codecs and their undoing.

A stream-protocol producer may send several messages as one sub-entry batch, compressed
with one of four codecs (the entry type byte's bits 4-6): gzip (a gzip member, as the
JDK's GZIPOutputStream writes), snappy (the snappy framing format, as xerial's
SnappyFramedOutputStream and Go's snappy writer), lz4 (an LZ4 frame) and zstd (a zstd
frame), the formats of RabbitMQ's Java, Go and .NET clients. The C parser of Publish
frames (`_streamwire.encode_publish`) handles uncompressed batches only; a frame that
holds a compressed one is rewritten here with each batch decompressed (the same
messages, compression 0) and parsed again. Only frames with compressed batches take
this path.

The declared uncompressed length is checked against what the data decompresses to:
decompression writes into a buffer of exactly that length and fails if the data holds
more (a compression bomb stops at the buffer's end) or less. A batch may decompress to
at most BATCH_BYTES_MAX.
"""

from __future__ import annotations

import struct
from types import ModuleType
from typing import Final

COMPRESSED_TEXT: Final = "compressed sub-entry batches are not supported"  # _streamwire.c
BATCH_BYTES_MAX: Final = 64 * 1024 * 1024  # one batch's messages, decompressed
SUB_ENTRY: Final = 0x80  # the entry type byte's top bit
COMPRESSION_SHIFT: Final = 4
COMPRESSION_MASK: Final = 0x7

NONE: Final = 0
GZIP: Final = 1
SNAPPY: Final = 2
LZ4: Final = 3
ZSTD: Final = 4
NAMES: Final = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

_COUNT: Final = struct.Struct(">i")
_ID: Final = struct.Struct(">Q")
_FILTER_LENGTH: Final = struct.Struct(">h")
_SIZE: Final = struct.Struct(">I")
_BATCH: Final = struct.Struct(">BHII")  # type, message count, uncompressed and data length


class BadBatch(ValueError):
    """A Publish frame that cannot be decompressed (its text says why)."""


_codecs: dict[int, ModuleType] = {}


def codecs() -> dict[int, ModuleType]:
    """cramjam's codec modules by compression. cramjam is imported at the first
    compressed batch, not with the broker: it maps about 3 MiB that a broker whose
    clients never compress would hold for nothing (memory at rest, docs/perf.md)."""
    if not _codecs:
        import cramjam  # noqa: PLC0415  # deferred on purpose: see the docstring

        _codecs.update(
            {GZIP: cramjam.gzip, SNAPPY: cramjam.snappy, LZ4: cramjam.lz4, ZSTD: cramjam.zstd}
        )
    return _codecs


def _decompression_error() -> type[Exception]:
    import cramjam  # noqa: PLC0415  # imported by `codecs` already: a dict lookup

    error: type[Exception] = cramjam.DecompressionError
    return error


def decompress(compression: int, data: bytes | memoryview, length: int) -> bytes:
    """The `length` bytes that `data`, compressed with `compression`, holds; BadBatch if
    it holds more or fewer, is damaged, or the codec is unknown."""
    codec = codecs().get(compression)
    if codec is None:
        raise BadBatch(f"unknown sub-entry compression {compression}")
    if length > BATCH_BYTES_MAX:
        raise BadBatch(f"sub-entry batch of {length} bytes decompressed (limit {BATCH_BYTES_MAX})")
    out = bytearray(length)
    try:
        written = codec.decompress_into(bytes(data), out)
    except _decompression_error() as exc:
        raise BadBatch(f"{NAMES[compression]} sub-entry batch does not decompress: {exc}") from None
    if written != length:
        raise BadBatch(
            f"{NAMES[compression]} sub-entry batch decompresses to {written} bytes, "
            f"not the {length} it declares"
        )
    return bytes(out)


def compress(compression: int, messages: list[bytes]) -> bytes:
    """A sub-entry batch entry (type byte to data) of `messages` compressed with
    `compression`: what a client's producer sends after the publishing id."""
    plain = b"".join(_SIZE.pack(len(m)) + m for m in messages)
    data = plain if compression == NONE else bytes(codecs()[compression].compress(plain))
    kind = SUB_ENTRY | (compression << COMPRESSION_SHIFT)
    return _BATCH.pack(kind, len(messages), len(plain), len(data)) + data


def uncompress_batches(version: int, payload: bytes | memoryview) -> bytes:
    """`payload` (a Publish frame's body from its message count on, protocol `version`)
    with every compressed sub-entry batch decompressed in place. What the C parser checks
    (truncation, sizes, a batch's messages) it checks again on the result."""
    view = memoryview(payload)
    if len(view) < _COUNT.size:
        raise BadBatch("truncated message count")
    (count,) = _COUNT.unpack_from(view)
    out = [bytes(view[: _COUNT.size])]
    at = _COUNT.size
    for _ in range(max(count, 0)):
        start = at
        at += _ID.size
        if version >= 2:
            if len(view) < at + _FILTER_LENGTH.size:
                raise BadBatch("truncated filter value")
            (length,) = _FILTER_LENGTH.unpack_from(view, at)
            at += _FILTER_LENGTH.size + max(length, 0)
        if len(view) <= at:
            raise BadBatch("truncated message")
        if not view[at] & SUB_ENTRY:
            if len(view) < at + _SIZE.size:
                raise BadBatch("truncated message size")
            at += _SIZE.size + _SIZE.unpack_from(view, at)[0]
            out.append(bytes(view[start:at]))
            continue
        if len(view) < at + _BATCH.size:
            raise BadBatch("truncated sub-entry batch")
        kind, messages, plain_length, data_length = _BATCH.unpack_from(view, at)
        data = view[at + _BATCH.size : at + _BATCH.size + data_length]
        if len(data) < data_length:
            raise BadBatch("truncated sub-entry batch")
        compression = (kind >> COMPRESSION_SHIFT) & COMPRESSION_MASK
        head = bytes(view[start:at])
        at += _BATCH.size + data_length
        if compression == NONE:
            out.append(bytes(view[start:at]))
            continue
        plain = decompress(compression, data, plain_length)
        out.append(head + _BATCH.pack(SUB_ENTRY, messages, plain_length, plain_length) + plain)
    out.append(bytes(view[at:]))  # bytes after the last message: the C parser refuses them
    return b"".join(out)
