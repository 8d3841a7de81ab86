"""A classic queue's cursor over its vhost's log: ready order, requeues and in-flight set.

Owns which log offsets a queue holds and in what order they go out: new messages in
publish order, requeued ones first and in their original order, each with its
redelivered flag and delivery count. It holds offsets only, never message bodies (the
vhost's log and cache have those), and does no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import repeat
from typing import NamedTuple

from sortedcontainers import SortedList

from streamq.queues.journal import QueueJournal


class ReadyMessage(NamedTuple):
    offset: int
    redelivered: bool
    delivery_count: int  # deliveries before this one


_new = tuple.__new__  # builds the ReadyMessage of each delivery (the hot path)


class ClassicQueue:
    """The cursor state of one queue. Every operation is O(1) or O(log n) per message."""

    __slots__ = (
        "_delivery_counts",
        "_ready",
        "_requeued",
        "_sizes",
        "bytes_ready",
        "journal",
        "unacked",
    )

    def __init__(self, journal: QueueJournal | None = None) -> None:
        self.journal = journal  # durable queues record every change in it
        self._ready: deque[int] = deque()
        self._requeued = SortedList()
        self._delivery_counts: dict[int, int] = {}  # only for offsets delivered before
        self._sizes: dict[int, int] = {}
        self.unacked: set[int] = set()
        self.bytes_ready = 0

    @property
    def message_count(self) -> int:
        """Ready messages (what queue.declare-ok reports)."""
        return len(self._ready) + len(self._requeued)

    @property
    def unacked_count(self) -> int:
        return len(self.unacked)

    def enqueue(self, offset: int, size_bytes: int, priority: int = 0) -> None:
        """A new message, last in line (`priority` matters to priority queues only)."""
        self._ready.append(offset)
        self._sizes[offset] = size_bytes
        self.bytes_ready += size_bytes
        if self.journal is not None:
            self.journal.enqueued(offset)

    def enqueue_run(self, first: int, sizes: list[int], priorities: list[int] | None) -> None:
        """`enqueue` of the messages at offsets `first`, `first + 1`, ... with `sizes`
        (one run of publishes; `priorities` matters to priority queues only)."""
        offsets = range(first, first + len(sizes))
        self._ready.extend(offsets)
        self._sizes.update(zip(offsets, sizes, strict=True))
        self.bytes_ready += sum(sizes)
        if self.journal is not None:
            self.journal.enqueued_run(first, len(sizes))

    def restore(self, offset: int, size_bytes: int, delivery_count: int, priority: int = 0) -> None:
        """Start-up: the journal says the queue holds `offset` (in offset order)."""
        self._ready.append(offset)
        self._sizes[offset] = size_bytes
        self.bytes_ready += size_bytes
        if delivery_count:
            self._delivery_counts[offset] = delivery_count

    def delivery_count(self, offset: int) -> int:
        """How many times the message at `offset` was delivered so far."""
        return self._delivery_counts.get(offset, 0)

    def peek(self) -> int | None:
        """The offset `take` would return next, without taking it."""
        if self._requeued:
            return int(self._requeued[0])
        if self._ready:
            return self._ready[0]
        return None

    def take(self) -> ReadyMessage | None:
        """The next message to deliver, now in flight; None if nothing is ready."""
        if self._requeued:
            offset = int(self._requeued.pop(0))
        elif self._ready:
            offset = self._ready.popleft()
        else:
            return None
        return self._in_flight(offset)

    def _in_flight(self, offset: int) -> ReadyMessage:
        """The ready message at `offset`, just taken from its list, is now in flight."""
        self.bytes_ready -= self._sizes[offset]
        count = self._delivery_counts.get(offset, 0)
        self._delivery_counts[offset] = count + 1
        self.unacked.add(offset)
        if self.journal is not None:
            self.journal.delivered(offset, count + 1)
        return _new(ReadyMessage, (offset, count > 0, count))  # no NamedTuple __new__ call

    def take_expired(self, expired: Callable[[int], bool]) -> list[int]:
        """Take the messages at the head for which `expired(offset)` holds, stopping at
        the first that does not; they are in flight, as after `take`."""
        taken = []
        while (offset := self.peek()) is not None and expired(offset):
            self.take()
            taken.append(offset)
        return taken

    def ack(self, offset: int) -> int:
        """The message is gone from the queue (acked, or rejected without requeue).

        Returns its size in bytes.
        """
        self.unacked.discard(offset)
        self._delivery_counts.pop(offset, None)
        size = self._sizes.pop(offset, None)
        if size is None:
            return 0
        if self.journal is not None:
            self.journal.acked(offset)
        return size

    def ack_many(self, offsets: list[int]) -> None:
        """`ack` of each of `offsets` (an ack with `multiple`), in C-level loops."""
        self.unacked.difference_update(offsets)
        deque(map(self._delivery_counts.pop, offsets, repeat(None)), maxlen=0)
        sizes = list(map(self._sizes.pop, offsets, repeat(None)))
        if self.journal is not None:
            if None in sizes:  # some were gone already: only the others are acked now
                offsets = [o for o, size in zip(offsets, sizes, strict=True) if size is not None]
            self.journal.acked_many(offsets)

    def requeue(self, offset: int) -> None:
        """Back to ready, ahead of new messages and in original publish order."""
        if offset in self.unacked:
            self.unacked.discard(offset)
            self._requeued.add(offset)
            self.bytes_ready += self._sizes[offset]

    def purge(self) -> list[int]:
        """Drop every ready message; returns their offsets (in-flight ones stay)."""
        purged = [int(o) for o in self._requeued] + list(self._ready)
        self._requeued.clear()
        self._ready.clear()
        self._forget(purged)
        return purged

    def _forget(self, purged: list[int]) -> None:
        """The ready messages `purged`, taken off their lists, are gone from the queue."""
        journal = self.journal
        for offset in purged:
            self._sizes.pop(offset, None)
            self._delivery_counts.pop(offset, None)
            if journal is not None:
                journal.acked(offset)
        self.bytes_ready = 0

    def offsets(self) -> list[int]:
        """Every offset the queue still holds, ready or in flight."""
        return [int(o) for o in self._requeued] + list(self._ready) + sorted(self.unacked)

    def live_snapshot(self) -> tuple[list[int], dict[int, int]]:
        """What the journal must hold: every offset still held, sorted, and the delivery
        counts of those delivered before (C-level copies: cheap on the event loop)."""
        return sorted(self._sizes), dict(self._delivery_counts)

    def low_water_offset(self) -> int | None:
        """The smallest offset the queue still needs, or None if it needs none."""
        candidates = []
        if self._ready:
            candidates.append(self._ready[0])
        if self._requeued:
            candidates.append(int(self._requeued[0]))
        if self.unacked:
            candidates.append(min(self.unacked))
        return min(candidates) if candidates else None
