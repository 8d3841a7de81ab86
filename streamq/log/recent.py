"""The write buffers a segment log keeps in memory after handing them to the Syncer: the
ones not yet written, and up to `bytes_max` of written ones, so that readers right behind
the appenders read from memory rather than from the disk.

Owns the buffers, the lookup of the one holding a position, and their release when no
reader uses them. It does no I/O, and it never drops a buffer whose write is not done (its
bytes are nowhere else yet).

Memory at rest: the written buffers are worth their memory only while a reader is near
the tail. `release_if_unread`, which the log calls every `IDLE_RELEASE_S`, drops them all
when no read found its bytes in them since the last call (readers far behind, or none),
and, when the appends stopped too, tells its owner, which hands the freed memory back to
the kernel: glibc keeps freed blocks amid its heap for the process, so a released 32 MiB
tail would otherwise stay in the RSS (docs/perf.md, "Memory at rest").

Every lookup costs O(log n) in the number of kept buffers: traffic made of small
publishes, each flushed as its own write, keeps tens of thousands of small buffers, and a
scan from the oldest on every delivery cost a fifth of the broker's time under such load.
Buffers are appended in the log's order (segments by ascending base offset, positions
ascending within a segment, contiguous), so their (base offset, position) keys are
sorted and a bisection finds the one that holds a position.
"""

from __future__ import annotations

import concurrent.futures
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from typing import Final

from streamq.log.segment import Segment

# Dropped entries at the head of the lists are cut off in one step once there are this
# many and they are at least half of the lists: amortized O(1) per drop.
COMPACT_ENTRIES_MIN: Final = 1024
# The written buffers go when no read has found its bytes in them for this long (between
# one and two of these after the last such read, as the log checks once per period).
IDLE_RELEASE_S: Final = 0.5
# `at_rest` is called (to hand freed memory back to the kernel) after a release of at
# least this much: below it, the walk over the heap costs more than it gives back.
TRIM_AFTER_BYTES_MIN: Final = 1 << 20


class RecentWrites:
    """The buffers handed to the Syncer, oldest first, each with the segment and position
    it belongs at and its write's future."""

    __slots__ = (
        "_added_seen",
        "_at_rest",
        "_buffers",
        "_head",
        "_hits_seen",
        "_keys",
        "_segments",
        "_writes",
        "added",
        "bytes",
        "bytes_max",
        "hits",
        "rest_owed",
    )

    def __init__(self, bytes_max: int = 0, at_rest: Callable[[], object] = lambda: None) -> None:
        """`bytes_max`: written buffers kept, at most (0: none once written). `at_rest`:
        called after a release of much memory with no buffer added since the last one."""
        # Parallel lists; entries before `_head` are dropped and cut off later.
        self._keys: list[tuple[int, int]] = []  # (segment base offset, position)
        self._segments: list[Segment] = []
        self._buffers: list[bytearray] = []
        self._writes: list[concurrent.futures.Future[None]] = []
        self._head = 0
        self.bytes = 0
        self.bytes_max = bytes_max
        # Reads served from the buffers and buffers added, and their numbers at the last
        # `release_if_unread`.
        self.hits = 0
        self._hits_seen = 0
        self.added = 0
        self._added_seen = 0
        self._at_rest = at_rest
        self.rest_owed = False  # much was released since `at_rest` was last called

    def __len__(self) -> int:
        return len(self._keys) - self._head

    def add(
        self,
        segment: Segment,
        position: int,
        buffer: bytearray,
        written: concurrent.futures.Future[None],
    ) -> None:
        """Keep `buffer`, the bytes of `segment` from `position`, being written by
        `written`. It must follow every buffer kept before it in the log."""
        key = (segment.base_offset, position)
        assert len(self) == 0 or key > self._keys[-1], "buffers kept out of log order"
        self._keys.append(key)
        self._segments.append(segment)
        self._buffers.append(buffer)
        self._writes.append(written)
        self.bytes += len(buffer)
        self.added += 1

    def trim(self, keep_bytes: int, *, writes_parked: bool) -> None:
        """Drop the oldest written buffers while the others hold at least `keep_bytes`
        (`bytes_max`, unless releasing). Nothing goes while `writes_parked` (a write
        parked by a full disk completes its future without being on disk)."""
        if writes_parked:
            return
        buffers, writes = self._buffers, self._writes
        head, end = self._head, len(self._keys)
        while head < end and writes[head].done() and self.bytes - len(buffers[head]) >= keep_bytes:
            self.bytes -= len(buffers[head])
            buffers[head] = _EMPTY  # released now, not at the next compaction
            head += 1
        self._head = head
        if head >= COMPACT_ENTRIES_MIN and head * 2 >= end:
            self._cut_dropped()

    def _cut_dropped(self) -> None:
        head = self._head
        for entries in (self._keys, self._segments, self._buffers, self._writes):
            del entries[:head]
        self._head = 0

    def release_if_unread(self, *, writes_parked: bool) -> int:
        """Drop every written buffer if no read was served from the buffers since the
        last call; returns the bytes dropped. Buffers being written stay (see `trim`).
        Once much was released (now or at an earlier call) and nothing was added since
        the last call (the appends stopped too), calls `at_rest`: appends going on would
        only fault given-back memory in again."""
        seen, self._hits_seen = self._hits_seen, self.hits
        added, self._added_seen = self._added_seen, self.added
        if self.hits != seen:
            return 0
        before = self.bytes
        self.trim(0, writes_parked=writes_parked)
        self._cut_dropped()  # their entries (and writes' futures) too: it may stay idle
        released = before - self.bytes
        if released >= TRIM_AFTER_BYTES_MIN:
            self.rest_owed = True
        if self.rest_owed and self.added == added:
            self.rest_owed = False
            self._at_rest()
        return released

    def find(self, segment: Segment, position: int) -> tuple[bytearray | None, int]:
        """The buffer of `segment` holding `position`, and where that buffer starts; or
        (None, where the first kept buffer of `segment` starts, or -1 if none is kept).
        The bytes from that start on must be read from memory: they may not be written
        yet."""
        keys, head = self._keys, self._head
        base = segment.base_offset
        i = bisect_right(keys, (base, position), head) - 1
        if i >= head and self._segments[i] is segment:
            start = keys[i][1]
            if position < start + len(self._buffers[i]):
                self.hits += 1
                return self._buffers[i], start
        first = bisect_left(keys, (base, -1), head)
        if first < len(keys) and self._segments[first] is segment:
            return None, keys[first][1]
        return None, -1

    def holds(self, segment: Segment) -> bool:
        """Whether any buffer of `segment` is kept."""
        keys = self._keys
        first = bisect_left(keys, (segment.base_offset, -1), self._head)
        return first < len(keys) and self._segments[first] is segment


_EMPTY: Final = bytearray()
