"""A segment log's settings: `LogConfig`, fixed when the log is opened.

Owns the sizes and switches that shape a log (segment and record size caps, index
interval, write buffering, direct I/O, read chunks and descriptors, recent buffers). It
holds no state and does no I/O; the log's parts read these values (see `log`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MIB: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes_max: int = 8 * MIB
    index_interval_bytes: int = 4096
    # A record holds a message of up to 128 MiB (the broker's max message size) plus its
    # exchange, routing key and properties.
    record_bytes_max: int = 128 * MIB + MIB
    # Appends are held in memory up to this size, then handed to the Syncer thread, which
    # writes them (see `writer`); at most `writes_pending_bytes_max` wait there, beyond
    # which appending blocks until the disk catches up.
    write_buffer_bytes_max: int = MIB
    writes_pending_bytes_max: int = 8 * MIB
    # Segment writes bypass the page cache (O_DIRECT) where the file system allows it.
    direct_io: bool = True
    # Plain (page cache) writes start their write-back at once (sync_file_range), so that
    # dirty pages do not pile up until the round's fdatasync; streams write this way
    # (docs/durability.md, "The page cache").
    write_behind: bool = False
    read_chunk_bytes: int = 256 * 1024
    read_fds_max: int = 32
    # Written buffers kept in memory after their write, up to this many bytes, so that
    # `read_at` serves the newest records from memory (readers right behind appenders)
    # rather than from the disk past the page cache. 0 keeps none: only the buffers not
    # yet written are read from memory.
    recent_bytes_max: int = 0
    # The format of the segments this log creates: 1 records (every log), 2 osiris chunks
    # (streams; docs/log-format.md). Segments of both may be in one log.
    format_version: int = 1
    # Version 2: a chunk's entries, at most (a bigger entry is a chunk alone): 1 MiB less
    # a Deliver's frame header (17 bytes) and the chunk header (48).
    chunk_data_bytes_max: int = MIB - 65
    bloom_size: int = 16  # a version-2 chunk's filter bytes when an entry has a value
