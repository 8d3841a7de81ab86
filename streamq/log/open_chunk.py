"""The chunk a version-2 log is gathering: entries appended since the last cut.

Owns what goes into the next chunk before it is written (its first offset, timestamp,
encoded entries, the filter values and publisher sequences of its trailer) and its
encoding into a frame (`frame`, `chunk`). No I/O; the log's `chunk_appender` decides
when a chunk is cut and where its frame goes.
"""

from __future__ import annotations

from streamq.log import chunk, frame
from streamq.log._streamwire import crc32 as _crc32
from streamq.log.bloom import bloom_filter


class OpenChunk:
    """Entries gathered for one chunk, from `first_offset` on."""

    __slots__ = (
        "data_bytes",
        "entries",
        "filter_values",
        "first_offset",
        "parts",
        "records",
        "sequences",
        "timestamp_ms",
    )

    def __init__(self, first_offset: int, timestamp_ms: int) -> None:
        self.first_offset = first_offset
        self.timestamp_ms = timestamp_ms
        self.parts: list[bytes] = []  # encoded entries
        self.entries = 0
        self.records = 0
        self.data_bytes = 0
        self.filter_values: list[tuple[int, bytes]] = []  # (entry number, value)
        self.sequences: dict[bytes, int] = {}

    def add(self, encoded: bytes, records: int, filter_value: bytes) -> None:
        if filter_value:
            self.filter_values.append((self.entries, filter_value))
        self.parts.append(encoded)
        self.entries += 1
        self.records += records
        self.data_bytes += len(encoded)

    def note_sequence(self, reference: bytes, sequence: int) -> None:
        if sequence > self.sequences.get(reference, -1):
            self.sequences[reference] = sequence

    def encode(self, epoch: int, bloom_size: int) -> tuple[bytes, int]:
        """The frame of this chunk, and the chunk's size (the frame less its 8 bytes)."""
        data = b"".join(self.parts)
        bloom = bloom_filter(
            [v for _, v in self.filter_values] + [b""] * self._unfiltered(), bloom_size
        )
        trailer = frame.encode_trailer(self.sequences, self.filter_values)
        header = chunk.HEADER.pack(
            chunk.MAGIC_VERSION, chunk.CHUNK_TYPE_USER, self.entries, self.records,
            self.timestamp_ms, epoch, self.first_offset, _crc32(data, 0), len(data),
            len(trailer), len(bloom),
        )  # fmt: skip
        body = b"".join((header, bloom, data, trailer))
        return frame.encode_frame(body), len(body)

    def _unfiltered(self) -> int:
        """1 when some entry has no filter value (it sets the filter's bit 0), else 0."""
        return 1 if len(self.filter_values) < self.entries else 0
