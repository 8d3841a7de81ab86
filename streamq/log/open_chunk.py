"""The chunk a version-2 log is gathering: entries appended since the last cut.

Owns what goes into the next chunk before it is written (its first offset, timestamp,
encoded entries, the filter values, publisher sequences and entry checksums of its
trailer) and its
encoding into a frame (`frame`, `chunk`). No I/O; the log's `chunk_appender` decides
when a chunk is cut and where its frame goes.
"""

from __future__ import annotations

from streamq.log import chunk, frame
from streamq.log._records import crc32c, entry_crcs
from streamq.log._streamwire import crc32 as _crc32
from streamq.log.bloom import bloom_filter


class OpenChunk:
    """Entries gathered for one chunk, from `first_offset` on."""

    __slots__ = (
        "data_bytes",
        "entries",
        "filter_runs",
        "filtered",
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
        self.filter_runs: list[frame.FilterRun] = []  # (first entry, entries, value)
        self.filtered = 0  # entries with a value
        self.sequences: dict[bytes, int] = {}

    def add(self, encoded: bytes, records: int, filter_value: bytes) -> None:
        if filter_value:
            frame.add_filter_run(self.filter_runs, self.entries, 1, filter_value)
            self.filtered += 1
        self.parts.append(encoded)
        self.entries += 1
        self.records += records
        self.data_bytes += len(encoded)

    def add_run(
        self, data: bytes, entries: int, records: int, filter_runs: list[frame.FilterRun]
    ) -> None:
        """Add `entries` entries already encoded back to back in `data`; `filter_runs`
        numbered from the run's first entry."""
        base = self.entries
        for first, count, value in filter_runs:
            frame.add_filter_run(self.filter_runs, base + first, count, value)
            self.filtered += count
        self.parts.append(data)
        self.entries += entries
        self.records += records
        self.data_bytes += len(data)

    def note_sequence(self, reference: bytes, sequence: int) -> None:
        if sequence > self.sequences.get(reference, -1):
            self.sequences[reference] = sequence

    def encode(self, epoch: int, bloom_size: int) -> tuple[list[bytes], int]:
        """The frame of this chunk as pieces to write back to back (frame head, chunk
        header, filter, entries, trailer: the entries are not copied again), and the
        chunk's size (the frame less its 8 bytes)."""
        data = b"".join(self.parts)
        values = {value for _, _, value in self.filter_runs}
        if self.filtered < self.entries:
            values.add(b"")  # an entry without a value: the filter's bit 0
        bloom = bloom_filter(values, bloom_size)
        trailer = frame.encode_trailer(self.sequences, self.filter_runs, entry_crcs(data))
        header = chunk.HEADER.pack(
            chunk.MAGIC_VERSION, chunk.CHUNK_TYPE_USER, self.entries, self.records,
            self.timestamp_ms, epoch, self.first_offset, _crc32(data, 0), len(data),
            len(trailer), len(bloom),
        )  # fmt: skip
        head = frame.FRAME_HEAD.pack(crc32c(trailer, crc32c(header + bloom)), 0)
        return [head, header, bloom, data, trailer], len(header) + len(bloom) + len(data) + len(
            trailer
        )
