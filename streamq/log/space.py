"""A full disk: the writes it holds back, and the log's wait for room.

Owns what `SegmentLog` does when a write finds the file system full before anything of
it was fsynced (see `writer` and `files.append_all`, which cut such a write back and raise
OutOfSpace): the segment writes parked on the Syncer thread, in order, until a retry
lands them (`StalledWrites`); the companion files' writes, fdatasyncs and actions run in
batches that a full disk interrupts and a later round resumes where they stopped
(`run_companions`); and the event-loop side of the wait, with its backoff and its two log
lines (`SpaceWait`). It never decides what the log does with an fsync error: a failed
fsync cannot be retried safely, and the log fails on it, full disk or not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from streamq.log.errors import OutOfSpace
from streamq.log.files import append_all, close_fd

logger = logging.getLogger(__name__)

# Retries of a log that ran out of space: the first soon (a consumer's acks may free a
# segment at once), then backing off to one a second until there is room.
RETRY_S_MIN: Final = 0.1
RETRY_S_MAX: Final = 1.0


class StalledWrites:
    """Segment writes (and writer closes) parked behind one that found the disk full.

    Used on the Syncer thread only, except `bytes` and `error`, which the event loop reads
    (single attribute reads: a stale value only delays what it decides by one look).
    """

    def __init__(self) -> None:
        self._ops: deque[tuple[Callable[[], None], int]] = deque()
        self.bytes = 0  # the data of the parked writes, held in memory
        self.error: OutOfSpace | None = None  # the last OutOfSpace met; None once clear

    def run_or_park(self, op: Callable[[], None], size: int) -> None:
        """Run `op` (a segment write of `size` bytes, or a writer's close with size 0)
        unless earlier ones wait: then, or if it finds the disk full, park it. Raises
        what `op` raises but OutOfSpace."""
        if self._ops:
            self._park(op, size)
            return
        try:
            op()
        except OutOfSpace as exc:
            self.error = exc
            self._park(op, size)

    def retry(self) -> bool:
        """Run the parked operations in order until one finds the disk still full; True
        when none is left. Raises what an operation raises but OutOfSpace."""
        ops = self._ops
        while ops:
            op, size = ops[0]
            try:
                op()
            except OutOfSpace as exc:
                self.error = exc
                return False
            ops.popleft()
            self.bytes -= size
        self.error = None
        return True

    def drop(self) -> None:
        """The log is closing without its parked writes (they were never confirmed): run
        only the parked closes, so that no descriptor is left open."""
        ops, self._ops = self._ops, deque()
        self.bytes = 0
        self.error = None
        for op, size in ops:
            if size == 0:  # a writer's close (writes are never empty)
                op()

    def _park(self, op: Callable[[], None], size: int) -> None:
        self._ops.append((op, size))
        self.bytes += size


@dataclass(slots=True)
class CompanionBatch:
    """The companion work of one round: `writes` (appended on the Syncer thread, to
    descriptors among `fds`), then an fdatasync of every one of `fds` (duplicates the
    batch owns and closes), then `actions`, in order."""

    fds: list[int]
    writes: list[tuple[int, bytes]]
    actions: list[Callable[[], None]]


def run_companions(batches: list[CompanionBatch]) -> list[CompanionBatch]:
    """On the Syncer thread: run the batches in order and return what a full disk left
    of them, for a later round to run first ([] when all is done).

    A write that finds no room is cut back (`append_all`); an action that finds none raises
    OutOfSpace before it changed anything for good (it is run again). Raises any other
    error, an fsync's included, with every descriptor of the batches closed.
    """
    for i, batch in enumerate(batches):
        try:
            for j, (fd, data) in enumerate(batch.writes):
                try:
                    append_all(fd, data)
                except OutOfSpace:
                    batch.writes = batch.writes[j:]
                    return batches[i:]
            for fd in batch.fds:
                os.fdatasync(fd)
        except BaseException:
            close_batches(batches[i:])
            raise
        close_batches([batch])
        batch.writes = []
        for j, action in enumerate(batch.actions):
            try:
                action()
            except OutOfSpace:
                batch.actions = batch.actions[j:]
                return batches[i:]
            except BaseException:
                close_batches(batches[i + 1 :])
                raise
    return []


def close_batches(batches: list[CompanionBatch]) -> None:
    for batch in batches:
        for fd in batch.fds:
            close_fd(fd)
        batch.fds = []


@dataclass(slots=True)
class SpaceWait:
    """The event-loop side of a log waiting for room: who waits, the next retry."""

    directory: str
    error: OutOfSpace
    since_s: float = field(default_factory=time.monotonic)
    retry_s: float = RETRY_S_MIN
    timer: asyncio.TimerHandle | None = None
    returned: asyncio.Future[None] | None = None  # done when the wait ends, either way

    def __post_init__(self) -> None:
        logger.error(
            "log %s: out of disk space (%s); holding its writes and confirms, publishers "
            "blocked, retrying until there is room",
            self.directory,
            self.error,
        )

    def waiter(self) -> asyncio.Future[None]:
        if self.returned is None:
            self.returned = asyncio.get_running_loop().create_future()
        return self.returned

    def schedule(self, retry: Callable[[], None]) -> None:
        """Call `retry` after the current backoff (doubling up to RETRY_S_MAX), unless a
        retry is already due; without a running event loop, the next round retries."""
        if self.timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self.timer = loop.call_later(self.retry_s, retry)
        self.retry_s = min(self.retry_s * 2, RETRY_S_MAX)

    def end(self, *, resumed: bool) -> None:
        """Stop retrying and wake the waiters; with `resumed`, say that writes go on."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.returned is not None and not self.returned.done():
            self.returned.set_result(None)
        if resumed:
            logger.warning(
                "log %s: disk space available again after %.1f s; writes resumed",
                self.directory,
                time.monotonic() - self.since_s,
            )
