"""The turns of one priority's consumers of a queue: RabbitMQ's round robin.

Owns the order in which the consumers of one `x-priority` level of a queue get messages
(rabbit_queue_consumers): `active` is the queue of consumers with credit, whose head
takes the next turn and then goes to the tail; a consumer found without credit at the
head is `parked` until its gateway says its credit may have grown (`unblock`), and then
rejoins at the tail. So a delivery round costs O(1) per turn, whatever the number of
consumers without credit: it never walks them.

Costs: a deque and an insertion-ordered dict of the level's consumers; `add`, `unblock`
and parking O(1), `remove` O(consumers) (a cancel, not on the per-message path). It
knows nothing of credit or delivery: `delivery._rotate` asks the consumers.
"""

from __future__ import annotations

from collections import deque
from itertools import count
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from streamq.broker.queue import Consumer


_park_numbers: Final = count()
"""Numbers parkings in the order they happen, across queues: consumers whose credit comes
back together (one channel's) rejoin in the order they were parked (`parked_at`), as
RabbitMQ's unblock moves a channel's blocked consumers back in their order."""


class Turns:
    """The consumers of one priority level of a queue, in RabbitMQ's turn order."""

    __slots__ = ("active", "parked", "priority")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.active: deque[Consumer] = deque()
        # Insertion-ordered, O(1) to leave; each with its number in `_park_numbers`.
        self.parked: dict[Consumer, int] = {}

    def __len__(self) -> int:
        return len(self.active) + len(self.parked)

    def add(self, consumer: Consumer) -> None:
        """A new consumer takes its first turn after those already there."""
        self.active.append(consumer)

    def remove(self, consumer: Consumer) -> None:
        """The consumer leaves (cancelled, or its channel closed)."""
        if consumer in self.parked:
            del self.parked[consumer]
        else:
            self.active.remove(consumer)

    def park(self) -> None:
        """The head has no credit: it waits out of the turns until `unblock`."""
        self.parked[self.active.popleft()] = next(_park_numbers)

    def parked_at(self, consumer: Consumer) -> int | None:
        """When `consumer` was parked (a number that orders parkings), None if it is not."""
        return self.parked.get(consumer)

    def unblock(self, consumer: Consumer) -> None:
        """`consumer`'s credit may have grown: if parked, it rejoins at the tail, as
        RabbitMQ's unblock does. One still without credit is parked again at its turn."""
        parked = self.parked
        if consumer in parked:
            del parked[consumer]
            self.active.append(consumer)
