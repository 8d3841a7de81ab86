"""What a segment log holds: `LogState`, the state its parts share, and its checks.

Owns the log's state in one place, set up in `__init__`: the segments and their offsets
and timestamps, the write buffer and the writes handed to the Syncer thread, the sync
rounds in flight, the wait for disk space, the read descriptors and mappings, the recent
buffers, the damage map, failure and closing. `SegmentLog` (see `log`) is this state with
its parts, each a class over it in its own module: `appender` (append path, segment
rolls), `commit` (group-committed sync rounds, a full disk) and `reader` (reads, lookups).
Those parts hold no state of their own, so that there is one place to see it all (and
the hot paths read it with no indirection: one attribute load per field).

This module reads no records and starts no round; it must not import the parts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import mmap
import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from streamq.log import files
from streamq.log import format as fmt
from streamq.log.chunk_runs import ChunkRun
from streamq.log.config import LogConfig
from streamq.log.damage import DamageMap
from streamq.log.errors import LogClosed, LogFailed, OutOfSpace
from streamq.log.index import ChunkIndex
from streamq.log.open_chunk import OpenChunk
from streamq.log.recent import RecentWrites
from streamq.log.rounds import CompanionWork, RoundResult
from streamq.log.segment import Segment, SegmentInfo
from streamq.log.space import CompanionBatch, SpaceWait, StalledWrites
from streamq.log.syncer import Syncer


class LogState:
    """The state of one `SegmentLog`, and the checks every part of it makes."""

    def __init__(
        self, directory: str, config: LogConfig, syncer: Syncer, segments: list[Segment]
    ) -> None:
        self.directory = directory
        self.config = config
        self._record_bytes_max = config.record_bytes_max
        self._segment_bytes_max = config.segment_bytes_max
        self._write_buffer_bytes_max = config.write_buffer_bytes_max
        self._syncer = syncer
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._active = segments[-1]
        self._next_offset = self._active.next_offset
        # Timestamps never decrease: after a roll the active segment may still be empty,
        # so the floor is the newest timestamp of any segment.
        self._last_timestamp_ms = max(
            [0, _header_floor(self._active), *(s.last_timestamp_ms for s in segments)]
        )
        self._durable_next = self._next_offset
        self._buffer = bytearray()
        # Version 2: the chunk being gathered (cut at each round), and the writer's epoch:
        # one more than the newest stored chunk's, so each opening of the log for writes
        # (a start, or a node taking over as leader) begins an epoch, as osiris bumps
        # its writer's epoch at each election; 1 for a log with no chunk yet.
        self._open_chunk: OpenChunk | None = None
        self._epoch = _stored_epoch(segments) + 1
        # Version 2: the records of the chunks read last, by (segment base, position).
        self._decoded: dict[tuple[int, int], list[fmt.Record]] = {}
        # ... and as version-1 records for the C run path (None: they have none).
        self._runs: dict[tuple[int, int], ChunkRun | None] = {}
        self._unsealed: list[Segment] = []
        self._dir_dirty = False
        self._inflight: asyncio.Future[RoundResult] | None = None
        # In a cluster: rounds done here whose replicas have not acked yet, oldest first,
        # as (the offset they make durable, their round number, done once replicated).
        # The next round may start meanwhile (see `_start_round`).
        self._replicating: deque[tuple[int, int, asyncio.Future[None]]] = deque()
        self._rounds_started = 0
        self._rounds_finished = 0
        self._companions: list[Callable[[], CompanionWork]] = []
        self._failed: LogFailed | None = None
        self._closed = False
        # Writes handed to the Syncer thread and not yet seen done, with their sizes; the
        # first error a write met (set on that thread, raised by the next round or flush).
        self._writes: deque[tuple[concurrent.futures.Future[None], int]] = deque()
        self._writes_bytes = 0
        self._write_error: BaseException | None = None
        # A full disk (see `space`): writes parked on the Syncer thread, companion work
        # left for the next round, and the wait for room on the event loop.
        self._stalled = StalledWrites()
        self._companions_left: list[CompanionBatch] = []
        self._companions_stalled = False
        self._space: SpaceWait | None = None
        self._read_fds: dict[int, int] = {}
        self._maps: dict[int, mmap.mmap] = {}  # sealed segments mapped by `view_at`
        # Buffers handed to the Syncer, oldest first, with the segment and position they
        # belong at and their write: `read_at` reads from them until they are written
        # and, up to `recent_bytes_max`, a while longer: while reads use them (see
        # `release_recent_if_unread`, on a timer armed while any is kept).
        self._recent = RecentWrites(config.recent_bytes_max, self._at_rest)
        self._recent_timer: asyncio.TimerHandle | None = None
        self.damage = DamageMap()  # records lost to bit rot, skipped by every reader
        self._durable_fd = files.open_fd(
            os.path.join(directory, fmt.DURABLE_FILE), os.O_RDWR | os.O_CREAT, 0o644
        )
        files.pwrite(self._durable_fd, fmt.encode_durable(self._durable_next), 0)

    # -- state ---------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._next_offset

    @property
    def durable_next(self) -> int:
        """Every record below this offset is durable; readers see only those."""
        return self._durable_next

    @property
    def last_timestamp_ms(self) -> int:
        """The timestamp of the newest append (appends never go below it)."""
        return self._last_timestamp_ms

    @property
    def chunked(self) -> bool:
        """Whether appends go to a version-2 segment (`append_entries`), not records."""
        return self._active.version != fmt.FORMAT_VERSION

    @property
    def start_offset(self) -> int:
        """The first offset still in the log (retention drops segments from the head)."""
        return self._segments[0].base_offset

    @property
    def failed(self) -> LogFailed | None:
        return self._failed

    @property
    def out_of_space(self) -> bool:
        """Whether writes wait for disk space (they are retried until there is room)."""
        return self._space is not None

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def segments(self) -> list[SegmentInfo]:
        return [
            SegmentInfo(
                s.base_offset,
                s.next_offset,
                s.size_bytes,
                s.first_timestamp_ms,
                s.last_timestamp_ms,
                s is self._active,
            )
            for s in self._segments
        ]

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise LogClosed(self.directory)

    def _fail(self, cause: BaseException) -> LogFailed:
        if self._failed is None:
            self._failed = LogFailed(self.directory, cause)
            self._end_space_wait(resumed=False)  # its waiters see the failure
        return self._failed

    def _end_space_wait(self, *, resumed: bool) -> None:
        space, self._space = self._space, None
        if space is not None:
            space.end(resumed=resumed)
            self._syncer.space_changed(self.directory, out_of_space=False)

    if TYPE_CHECKING:
        # Calls from one part into another, declared here for the type checker only (at
        # run time `SegmentLog` has them from its parts: see the module docstring).
        def _flush(self, segment: Segment) -> None: ...  # appender
        def _seal_active(self, offset: int, position: int, version: int = 0) -> None: ...
        def _cut_chunk(self) -> None: ...  # chunk_appender
        def _ran_out_of_space(self, error: OutOfSpace) -> None: ...  # commit
        def _arm_recent_release(self) -> None: ...  # log
        def _at_rest(self) -> None: ...  # log


def _header_floor(segment: Segment) -> int:
    """The floor timestamp in the segment's header (see `format.encode_segment_header`)."""
    with open(segment.path, "rb") as file:
        return fmt.decode_segment_floor(file.read(fmt.SEGMENT_HEADER_BYTES))


def _stored_epoch(segments: list[Segment]) -> int:
    """The epoch of the newest chunk of `segments` (0 when none has a chunk)."""
    for segment in reversed(segments):
        index = segment.index
        if isinstance(index, ChunkIndex) and len(index.epochs):
            return int(index.epochs[-1])
    return 0
