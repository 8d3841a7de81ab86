"""Sub-entry batches stored in chunks: their messages, decompressed.

Owns undoing a stored sub-entry batch entry (`chunk.EntryView` with `batch` set) into its
messages: the body decompressed with the batch's codec (gzip, snappy, lz4, zstd, through
cramjam), checked against the declared length (a compression bomb stops at the buffer's
end), then split into `u32 size | message` items whose count must be the batch's. The
stream protocol's Publish path keeps batches compressed; the readers that need messages
(AMQP consumers, the web UI, Spark) call this.
"""

from __future__ import annotations

import struct
from types import ModuleType
from typing import Final

from streamq.log import chunk
from streamq.log.chunk import ChunkInvalid, EntryView

BATCH_BYTES_MAX: Final = 64 * 1024 * 1024  # one batch's messages, decompressed
_SIZE: Final = struct.Struct(">I")
_codecs: dict[int, ModuleType] = {}


def codecs() -> dict[int, ModuleType]:
    """cramjam's codec modules by compression, imported at the first compressed batch
    read, not with the broker (about 3 MiB mapped; as `queues.sub_entries.codecs`)."""
    if not _codecs:
        import cramjam  # noqa: PLC0415  # deferred on purpose: see the docstring

        _codecs.update(
            {
                chunk.COMPRESSION_GZIP: cramjam.gzip,
                chunk.COMPRESSION_SNAPPY: cramjam.snappy,
                chunk.COMPRESSION_LZ4: cramjam.lz4,
                chunk.COMPRESSION_ZSTD: cramjam.zstd,
            }
        )
    return _codecs


def decompress(compression: int, data: bytes | memoryview, length: int) -> bytes:
    """The `length` bytes that `data`, compressed with `compression`, holds; ValueError if
    it holds more or fewer, is damaged, or the codec is unknown."""
    if compression == chunk.COMPRESSION_NONE:
        return bytes(data)
    codec = codecs().get(compression)
    if codec is None:
        raise ValueError(f"unknown sub-entry compression {compression}")
    if length > BATCH_BYTES_MAX:
        raise ValueError(
            f"sub-entry batch of {length} bytes decompressed (limit {BATCH_BYTES_MAX})"
        )
    out = bytearray(length)
    try:
        written = codec.decompress_into(bytes(data), out)
    except _decompression_error() as exc:
        raise ValueError(f"sub-entry batch does not decompress: {exc}") from None
    if written != length:
        raise ValueError(f"sub-entry batch decompresses to {written} bytes, not {length}")
    return bytes(out)


def _decompression_error() -> type[Exception]:
    import cramjam  # noqa: PLC0415  # imported by `codecs` already: a dict lookup

    error: type[Exception] = cramjam.DecompressionError
    return error


def messages(entry: EntryView) -> list[bytes]:
    """The messages of a batch entry; ChunkInvalid when they do not decompress or do not
    fill the batch exactly with its record count."""
    try:
        plain = decompress(entry.compression, entry.data, entry.uncompressed_length)
    except ValueError as exc:
        raise ChunkInvalid(f"batch at offset {entry.offset}: {exc}") from None
    out: list[bytes] = []
    at = 0
    while at < len(plain):
        if len(plain) - at < _SIZE.size:
            raise ChunkInvalid(f"batch at offset {entry.offset}: a message crosses its end")
        (size,) = _SIZE.unpack_from(plain, at)
        at += _SIZE.size
        if size > len(plain) - at:
            raise ChunkInvalid(f"batch at offset {entry.offset}: a message crosses its end")
        out.append(plain[at : at + size])
        at += size
    if len(out) != entry.records:
        raise ChunkInvalid(
            f"batch at offset {entry.offset}: {len(out)} messages, it says {entry.records}"
        )
    return out
