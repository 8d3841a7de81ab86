"""The sparse offset and timestamp index of one segment, held in memory.

Owns the lookup arrays and their search; it does no I/O (`format` encodes the index file,
`segment` and `log` read and write it). Every entry maps a record's offset relative to the
segment base to its byte position and append timestamp. Timestamps never decrease within
a log, so one set of entries serves both `seek(offset)` and `seek(timestamp_ms)`.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable


class SparseIndex:
    """Entries for the first record and then one per `interval_bytes` of segment data."""

    __slots__ = ("interval_bytes", "last_position", "positions", "relative_offsets", "timestamps")

    def __init__(self, interval_bytes: int) -> None:
        self.interval_bytes = interval_bytes
        self.relative_offsets = array("I")
        self.positions = array("I")
        self.timestamps = array("q")
        # Position of the newest entry; far negative so that the first record gets one.
        self.last_position = -(1 << 62)

    @classmethod
    def from_entries(
        cls, interval_bytes: int, entries: Iterable[tuple[int, int, int]]
    ) -> SparseIndex:
        index = cls(interval_bytes)
        columns = list(zip(*entries, strict=True))
        if columns:  # C-level copies: an index file's entries are read at every start
            index.relative_offsets.extend(columns[0])
            index.positions.extend(columns[1])
            index.timestamps.extend(columns[2])
            index.last_position = index.positions[-1]
        return index

    def __len__(self) -> int:
        return len(self.positions)

    def add(self, relative_offset: int, position: int, timestamp_ms: int) -> None:
        self.relative_offsets.append(relative_offset)
        self.positions.append(position)
        self.timestamps.append(timestamp_ms)
        self.last_position = position

    def insert(self, relative_offset: int, position: int, timestamp_ms: int) -> None:
        """An entry anywhere (where records resume after damage, `damage`): a lookup past
        the damage then starts after it. A no-op if the offset has an entry already."""
        i = bisect_left(self.relative_offsets, relative_offset)
        if i < len(self.relative_offsets) and self.relative_offsets[i] == relative_offset:
            return
        self.relative_offsets.insert(i, relative_offset)
        self.positions.insert(i, position)
        self.timestamps.insert(i, timestamp_ms)
        self.last_position = self.positions[-1]

    def maybe_add(self, relative_offset: int, position: int, timestamp_ms: int) -> None:
        """Add an entry if the record starts an interval after the previous entry."""
        if position - self.last_position >= self.interval_bytes:
            self.add(relative_offset, position, timestamp_ms)

    def entries(self) -> list[tuple[int, int, int]]:
        return list(zip(self.relative_offsets, self.positions, self.timestamps, strict=True))

    def floor_offset(self, relative_offset: int) -> tuple[int, int]:
        """(relative offset, position) of the last entry at or before `relative_offset`.

        The segment must have at least one entry (its first record).
        """
        i = bisect_right(self.relative_offsets, relative_offset) - 1
        assert i >= 0, "lookup before the segment's first record"
        return self.relative_offsets[i], self.positions[i]

    def floor_timestamp(self, timestamp_ms: int) -> tuple[int, int]:
        """(relative offset, position) of the last entry whose timestamp is below
        `timestamp_ms`, or the first entry; scanning forward from it finds the first record
        at or after that time.
        """
        i = max(bisect_left(self.timestamps, timestamp_ms) - 1, 0)
        return self.relative_offsets[i], self.positions[i]

    def truncate_after(self, position: int) -> None:
        """Drop the entries of records at or past `position` (recovery of a torn tail)."""
        keep = bisect_left(self.positions, position)
        del self.relative_offsets[keep:]
        del self.positions[keep:]
        del self.timestamps[keep:]
        self.last_position = self.positions[-1] if self.positions else -(1 << 62)


class ChunkIndex(SparseIndex):
    """The dense index of a version-2 segment: one entry per chunk (its frame's position,
    first offset and timestamp, as SparseIndex's), plus each chunk's record count, size
    and epoch, so that a reader plans a read without the chunk's header."""

    __slots__ = ("chunk_bytes", "epochs", "records")

    def __init__(self) -> None:
        super().__init__(0)  # every chunk gets an entry
        self.records = array("I")
        self.chunk_bytes = array("I")
        self.epochs = array("Q")

    @classmethod
    def from_chunks(cls, entries: Iterable[tuple[int, int, int, int, int, int]]) -> ChunkIndex:
        index = cls()
        for entry in entries:
            index.add_chunk(*entry)
        return index

    def add_chunk(
        self,
        relative_offset: int,
        position: int,
        timestamp_ms: int,
        records: int,
        chunk_bytes: int,
        epoch: int,
    ) -> None:
        self.add(relative_offset, position, timestamp_ms)
        self.records.append(records)
        self.chunk_bytes.append(chunk_bytes)
        self.epochs.append(epoch)

    def chunks(self) -> list[tuple[int, int, int, int, int, int]]:
        return list(
            zip(
                self.relative_offsets, self.positions, self.timestamps,
                self.records, self.chunk_bytes, self.epochs, strict=True,
            )
        )  # fmt: skip

    def find(self, relative_offset: int) -> int:
        """The number of the chunk holding `relative_offset`, or of the first chunk after
        it (offsets lost to damage have no chunk); len(self) past the last chunk."""
        i = bisect_right(self.relative_offsets, relative_offset) - 1
        if i < 0:
            return 0
        if relative_offset < self.relative_offsets[i] + self.records[i]:
            return i
        return i + 1

    def first_at_or_after(self, timestamp_ms: int) -> int:
        """The number of the first chunk whose timestamp is `timestamp_ms` or later."""
        return bisect_left(self.timestamps, timestamp_ms)

    def truncate_after(self, position: int) -> None:
        keep = bisect_left(self.positions, position)
        super().truncate_after(position)
        del self.records[keep:]
        del self.chunk_bytes[keep:]
        del self.epochs[keep:]
