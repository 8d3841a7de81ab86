"""A priority queue's cursor (`x-max-priority`): one ready order per priority level.

Owns the delivery order of a classic queue declared with `x-max-priority`: the highest
priority first, and within a priority the same order as a plain classic queue (requeued
messages first, in publish order, then new ones in publish order), so that a requeued
message goes back to its place among the messages of its own priority, as RabbitMQ does.
Priorities above the queue's maximum count as the maximum. Like `ClassicQueue`, it holds
offsets only, does no I/O, and records every change in the queue's journal; priorities
are not journalled, since they are a property of the message that the log keeps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import repeat
from typing import Final

from sortedcontainers import SortedList

from streamq.queues.classic import ClassicQueue, ReadyMessage
from streamq.queues.journal import QueueJournal

PRIORITY_MAX: Final = 255  # RabbitMQ's largest x-max-priority


class _Level:
    """The messages of one priority: requeued ones (sorted) ahead of new ones (FIFO)."""

    __slots__ = ("ready", "requeued")

    def __init__(self) -> None:
        self.ready: deque[int] = deque()
        self.requeued = SortedList()

    def __len__(self) -> int:
        return len(self.ready) + len(self.requeued)

    def first(self) -> int | None:
        if self.requeued:
            return int(self.requeued[0])
        if self.ready:
            return self.ready[0]
        return None

    def pop(self) -> int:
        if self.requeued:
            return int(self.requeued.pop(0))
        return self.ready.popleft()


class PriorityQueue(ClassicQueue):
    """The cursor of a priority queue. Finding the next message looks at the levels in
    use only (a queue whose publishers use priorities 0 and 5 has two), highest first."""

    __slots__ = ("_levels", "_priorities", "_ready_count", "_used", "max_priority")

    def __init__(self, max_priority: int, journal: QueueJournal | None = None) -> None:
        assert 1 <= max_priority <= PRIORITY_MAX
        super().__init__(journal)
        self.max_priority = max_priority
        self._levels: dict[int, _Level] = {}
        self._used: list[int] = []  # priorities with a level, highest first
        self._priorities: dict[int, int] = {}  # offset: priority, for priorities above 0
        self._ready_count = 0

    @property
    def message_count(self) -> int:
        return self._ready_count

    def _level(self, priority: int) -> _Level:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = _Level()
            self._used.append(priority)
            self._used.sort(reverse=True)
        return level

    def _add(self, offset: int, size_bytes: int, priority: int) -> None:
        priority = min(max(priority, 0), self.max_priority)
        self._level(priority).ready.append(offset)
        if priority:
            self._priorities[offset] = priority
        self._sizes[offset] = size_bytes
        self.bytes_ready += size_bytes
        self._ready_count += 1

    def enqueue(self, offset: int, size_bytes: int, priority: int = 0) -> None:
        self._add(offset, size_bytes, priority)
        if self.journal is not None:
            self.journal.enqueued(offset)

    def enqueue_run(self, first: int, sizes: list[int], priorities: list[int] | None) -> None:
        add = self._add
        for index, size_bytes in enumerate(sizes):
            add(first + index, size_bytes, priorities[index] if priorities else 0)
        if self.journal is not None:
            self.journal.enqueued_run(first, len(sizes))

    def restore(self, offset: int, size_bytes: int, delivery_count: int, priority: int = 0) -> None:
        self._add(offset, size_bytes, priority)
        if delivery_count:
            self._delivery_counts[offset] = delivery_count

    def _top(self) -> _Level | None:
        levels = self._levels
        for priority in self._used:
            level = levels[priority]
            if level.ready or level.requeued:
                return level
        return None

    def peek(self) -> int | None:
        level = self._top()
        return None if level is None else level.first()

    def take(self) -> ReadyMessage | None:
        level = self._top()
        return None if level is None else self._take_from(level)

    def take_expired(self, expired: Callable[[int], bool]) -> list[int]:
        """As RabbitMQ's priority queue, the head of every priority is looked at, not
        only the overall head: an expired message of a low priority goes without
        waiting for the higher ones to drain."""
        taken = []
        for priority in self._used:
            level = self._levels[priority]
            while (offset := level.first()) is not None and expired(offset):
                self._take_from(level)
                taken.append(offset)
        return taken

    def _take_from(self, level: _Level) -> ReadyMessage:
        self._ready_count -= 1
        return self._in_flight(level.pop())

    def ack(self, offset: int) -> int:
        self._priorities.pop(offset, None)
        return super().ack(offset)

    def ack_many(self, offsets: list[int]) -> None:
        deque(map(self._priorities.pop, offsets, repeat(None)), maxlen=0)
        super().ack_many(offsets)

    def requeue(self, offset: int) -> None:
        if offset in self.unacked:
            self.unacked.discard(offset)
            self._level(self._priorities.get(offset, 0)).requeued.add(offset)
            self._ready_count += 1
            self.bytes_ready += self._sizes[offset]

    def purge(self) -> list[int]:
        purged: list[int] = []
        for priority in self._used:
            level = self._levels[priority]
            purged += [int(o) for o in level.requeued]
            purged += level.ready
            level.requeued.clear()
            level.ready.clear()
        for offset in purged:
            self._priorities.pop(offset, None)
        self._forget(purged)
        self._ready_count = 0
        return purged

    def offsets(self) -> list[int]:
        held: list[int] = []
        for priority in self._used:
            level = self._levels[priority]
            held += [int(o) for o in level.requeued]
            held += level.ready
        return held + sorted(self.unacked)

    def low_water_offset(self) -> int | None:
        # Each level's lists are in offset order, so their heads are their smallest.
        candidates = [min(self.unacked)] if self.unacked else []
        for level in self._levels.values():
            if level.requeued:
                candidates.append(int(level.requeued[0]))
            if level.ready:
                candidates.append(level.ready[0])
        return min(candidates) if candidates else None
