"""A priority queue's cursor (`x-max-priority`): one ready order per priority level.

Owns the delivery order of a classic queue declared with `x-max-priority`: the highest
priority first, and within a priority the same order as a plain classic queue (requeued
messages first, in publish order, then new ones in publish order, as runs), so that a
requeued message goes back to its place among the messages of its own priority, as
RabbitMQ does. Priorities above the queue's maximum count as the maximum. Like
`ClassicQueue`, it holds offsets only and does no I/O; priorities are not journalled,
since they are a property of the message that the log keeps (a restart reads them back).
The priority of a message is held only while it is in flight, for its requeue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import repeat
from typing import Final

from streamq.queues.classic import ClassicQueue, Level
from streamq.queues.journal import QueueJournal

PRIORITY_MAX: Final = 255  # RabbitMQ's largest x-max-priority


class PriorityQueue(ClassicQueue):
    """The cursor of a priority queue. Finding the next message looks at the levels in
    use only (a queue whose publishers use priorities 0 and 5 has two), highest first."""

    __slots__ = ("_by_priority", "_in_flight", "_used", "max_priority")

    def __init__(self, max_priority: int, journal: QueueJournal | None = None) -> None:
        assert 1 <= max_priority <= PRIORITY_MAX
        super().__init__(journal)
        self.max_priority = max_priority
        self._by_priority: dict[int, Level] = {}
        self._used: list[int] = []  # priorities with a level, highest first
        self._in_flight: dict[int, int] = {}  # offset -> priority, above 0, in flight

    @property
    def message_count(self) -> int:
        return sum(len(level) for level in self._by_priority.values())

    def _level(self, priority: int) -> Level:
        priority = min(max(priority, 0), self.max_priority)
        level = self._by_priority.get(priority)
        if level is None:
            level = self._by_priority[priority] = Level(priority)
            self._used.append(priority)
            self._used.sort(reverse=True)
        return level

    def _top(self) -> Level | None:
        levels = self._by_priority
        for priority in self._used:
            level = levels[priority]
            if level.requeued or level.fresh:
                return level
        return None

    def _levels(self) -> list[Level]:
        return [self._by_priority[p] for p in self._used]

    def _requeue_level(self, offset: int) -> Level:
        return self._level(self._in_flight.pop(offset, 0))

    def delivered_run(self, first: int, sizes: list[int]) -> None:
        super().delivered_run(first, sizes)
        priority = self._taken_from.priority
        if priority:
            offsets = range(first, first + len(sizes))
            self._in_flight.update(zip(offsets, repeat(priority), strict=False))

    def delivered(self, offset: int, size: int) -> None:
        super().delivered(offset, size)
        priority = self._taken_from.priority
        if priority:
            self._in_flight[offset] = priority

    def take_expired(
        self,
        expired: Callable[[int], object],
        on_taken: Callable[[int, object], None] | None = None,
    ) -> list[int]:
        """As RabbitMQ's priority queue, the head of every priority is looked at, not
        only the overall head: an expired message of a low priority goes without
        waiting for the higher ones to drain."""
        if self._damaged:
            self._drop_damaged_head()
        taken = []
        for priority in self._used:
            level = self._by_priority[priority]
            while (offset := level.first()) is not None and (value := expired(offset)):
                if level.requeued:
                    level.requeued.pop(0)
                else:
                    level.fresh.pop_run(1)
                taken.append(offset)
                if on_taken is not None:
                    on_taken(offset, value)
        return taken

    def ack(self, offset: int) -> int:
        self._in_flight.pop(offset, None)
        return super().ack(offset)

    def ack_many(self, offsets: list[int]) -> None:
        if self._in_flight:
            deque(map(self._in_flight.pop, offsets, repeat(None)), maxlen=0)
        super().ack_many(offsets)
