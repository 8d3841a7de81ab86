"""The append path of a version-2 log: `ChunkAppender`, a part of `SegmentLog` (see `state`).

Owns appending entries to a log whose active segment holds chunks (docs/log-format.md,
"Format version 2"): entries gather in the open chunk (`open_chunk`) with dense offsets
given at once; the chunk is cut, framed and placed in the active segment (one index
entry per chunk) at the start of every sync round (`_cut_chunk`, called by `commit`), before
an entry that would take its entries past `chunk_data_bytes_max` or 65535 entries, and
never across segments (a chunk that does not fit rolls the segment first). Readers see
durable offsets only, so they never meet the open chunk.

Durability as `appender`'s: buffered, durable after a `sync()` that began after the
append returned. It holds no state of its own and never fsyncs.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from itertools import accumulate

from streamq.log import chunk, frame
from streamq.log.errors import LogError, RecordTooLarge
from streamq.log.frame import FilterRun
from streamq.log.index import ChunkIndex
from streamq.log.open_chunk import OpenChunk
from streamq.log.state import LogState


class ChunkAppender(LogState):
    """Entry appends and chunk cuts of a version-2 `SegmentLog`."""

    def append_entries(
        self,
        entries: Iterable[chunk.Entry],
        timestamp_ms: int,
        sequences: Mapping[bytes, int] | None = None,
    ) -> int:
        """Append chunk entries (simple messages as sent, sub-entry batches as sent,
        each with its filter value) and return the first one's offset; a batch takes as
        many offsets as it has records. `sequences`: publisher references and their
        highest publishing id among these entries, kept in the trailer of the chunk that
        holds the last of them (deduplication).

        Buffered; durable after a `sync()` that begins after this returns. Raises
        RecordTooLarge (appending nothing of that entry and what follows) for an entry
        over `record_bytes_max`, LogError on a version-1 log."""
        self._check_usable()
        if self._active.version != 2:
            raise LogError(f"log {self.directory}: append_entries on a version-1 segment")
        timestamp_ms = max(timestamp_ms, self._last_timestamp_ms)
        self._last_timestamp_ms = timestamp_ms
        first = self._next_offset
        limit = self.config.chunk_data_bytes_max
        for entry in entries:
            encoded = chunk.encode_entry(entry)
            if len(encoded) > self._record_bytes_max:
                raise RecordTooLarge(
                    f"entry of {len(encoded)} bytes exceeds {self._record_bytes_max}"
                )
            records = entry.records if isinstance(entry, chunk.SubBatch) else 1
            open_ = self._open_chunk
            if open_ is not None and (
                open_.data_bytes + len(encoded) > limit or open_.entries >= chunk.ENTRIES_MAX
            ):
                self._cut_chunk()
                open_ = None
            if open_ is None:
                open_ = self._open_chunk = OpenChunk(self._next_offset, timestamp_ms)
            open_.add(encoded, records, entry.filter_value)
            self._next_offset += records
        if sequences and self._open_chunk is not None:
            for reference, sequence in sequences.items():
                self._open_chunk.note_sequence(reference, sequence)
        return first

    def append_entry_run(
        self,
        data: bytes,
        sizes: bytes,
        records: bytes,
        filter_runs: list[FilterRun],
        timestamp_ms: int,
        sequences: Mapping[bytes, int] | None = None,
    ) -> int:
        """`append_entries` of entries already encoded back to back in `data` (the stream
        protocol's Publish path: `_streamwire.publish_entries`), `sizes` and `records`
        their sizes and record counts as native u32 arrays, `filter_runs` their filter
        values (first entry, entries, value). The run goes into the open chunk whole
        when it fits, else it is split at the chunk limits. Returns the first offset."""
        self._check_usable()
        if self._active.version != 2:
            raise LogError(f"log {self.directory}: append_entry_run on a version-1 segment")
        timestamp_ms = max(timestamp_ms, self._last_timestamp_ms)
        self._last_timestamp_ms = timestamp_ms
        first = self._next_offset
        count = len(sizes) // 4
        size_of, records_of = array("I"), array("I")
        size_of.frombytes(sizes)
        records_of.frombytes(records)
        limit = self.config.chunk_data_bytes_max
        at = done = 0
        while done < count:
            open_ = self._open_chunk
            if open_ is None:
                open_ = self._open_chunk = OpenChunk(self._next_offset, timestamp_ms)
            room, entries_room = limit - open_.data_bytes, chunk.ENTRIES_MAX - open_.entries
            if len(data) - at <= room and count - done <= entries_room:
                end, stop = len(data), count
            else:
                # How many of the rest fit: a C-level running sum and a bisection.
                ends = list(accumulate(size_of[done:count]))
                fit = min(bisect_right(ends, room), entries_room)
                stop, end = done + fit, at + (ends[fit - 1] if fit else 0)
                if stop == done:
                    if open_.entries:
                        self._cut_chunk()
                        continue
                    end, stop = at + size_of[done], done + 1  # over the limit: alone
            taken = sum(records_of[done:stop])
            values = _clip(filter_runs, done, stop)
            open_.add_run(data[at:end] if at or end < len(data) else data, stop - done, taken,
                          values)  # fmt: skip
            self._next_offset += taken
            at, done = end, stop
            if done < count:
                self._cut_chunk()
        if sequences and self._open_chunk is not None:
            for reference, sequence in sequences.items():
                self._open_chunk.note_sequence(reference, sequence)
        return first

    def _cut_chunk(self) -> None:
        """Close the open chunk, if any: frame it and place it in the active segment,
        rolling first when it would not fit (a chunk never spans segments)."""
        open_ = self._open_chunk
        if open_ is None:
            return
        self._open_chunk = None
        pieces, chunk_bytes = open_.encode(self._epoch, self.config.bloom_size)
        frame_size = frame.FRAME_HEAD_BYTES + chunk_bytes
        segment = self._active
        position = segment.size_bytes
        if (
            position + frame_size > self._segment_bytes_max
            and segment.next_offset > segment.base_offset
        ):
            self._seal_active(open_.first_offset, position)
            segment = self._active
            position = segment.size_bytes
        index = segment.index
        assert isinstance(index, ChunkIndex)
        index.add_chunk(
            open_.first_offset - segment.base_offset, position, open_.timestamp_ms,
            open_.records, chunk_bytes, self._epoch,
        )  # fmt: skip
        buffer = self._buffer
        for piece in pieces:
            buffer += piece
        if segment.first_timestamp_ms < 0:
            segment.first_timestamp_ms = open_.timestamp_ms
        segment.last_timestamp_ms = open_.timestamp_ms
        segment.size_bytes = position + frame_size
        segment.next_offset = open_.first_offset + open_.records
        if len(self._buffer) >= self._write_buffer_bytes_max:
            self._flush(segment)


def _clip(runs: list[FilterRun], start: int, stop: int) -> list[FilterRun]:
    """The parts of `runs` within entries [start, stop), numbered from `start`."""
    out = []
    for first, count, value in runs:
        low, high = max(first, start), min(first + count, stop)
        if low < high:
            out.append((low - start, high - low, value))
    return out
