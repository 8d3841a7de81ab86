"""A vhost's schedule: the work it owes its gateway at the next event-loop turn.

Owns two sets and the gateway's wake-up call: the queues due a drain round (`dirty`:
new messages, or consumers with new credit) and the streams with appends not yet
durable (`streams_unsynced`, and those whose sync round is in flight). Whoever makes
work due (a publish, an ack, a requeue, a stream append) adds to it here and, when it
was idle, calls `wakeup` once: the gateway then runs `VHost.drain` and the streams'
sync rounds in its next loop turn, so that deliveries and fsyncs are batched per turn.

It also takes a failed queue out of all of it (`fail_queue`). It is the lowest of the
vhost's components (see docs/architecture.md, "The vhost's components"): it imports
none of them and knows no AMQP; it never reads the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from streamq.broker.queue import Queue
from streamq.log_fields import QUEUE, VHOST

logger = logging.getLogger(__name__)


class Schedule:
    """The queues due a drain and the streams due a sync round, of one vhost."""

    __slots__ = (
        "_streams_syncing",
        "dirty",
        "name",
        "stream_synced_listeners",
        "streams_unsynced",
        "wakeup",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        # Queues due a drain round; `Delivery.drain` swaps in a new set and drains these.
        self.dirty: set[Queue] = set()
        # The gateway's: called when work becomes due while none was (once per turn).
        self.wakeup: Callable[[], None] = lambda: None
        self.streams_unsynced: set[Queue] = set()  # streams with appends not yet durable
        self._streams_syncing: set[Queue] = set()
        # Followers of streams outside the AMQP gateway (stream_gateway): called with the
        # queue after each sync round of a stream (its appends became durable: confirms
        # and deliveries are due).
        self.stream_synced_listeners: list[Callable[[Queue], None]] = []

    def kick(self, queue: Queue) -> None:
        """Ask for a drain of `queue` (it has new messages or its consumers new credit)."""
        if queue.consumers and (queue.stream is not None or queue.cursor.message_count):
            was_idle = not self.dirty
            self.dirty.add(queue)
            if was_idle:
                self.wakeup()

    def stream_appended(self, queue: Queue) -> None:
        """The stream `queue` has unsynced appends: the gateway starts a sync round."""
        if queue not in self.streams_unsynced:
            self.streams_unsynced.add(queue)
            self.wakeup()

    def streams_to_sync(self) -> list[Queue]:
        """Streams with appends and no sync round in flight; they are now in flight."""
        due = [q for q in self.streams_unsynced if q not in self._streams_syncing]
        self._streams_syncing.update(due)
        return due

    async def sync_stream(self, queue: Queue) -> None:
        """Make a stream's appends durable, hence readable: then wake its consumers."""
        assert queue.stream is not None
        log = queue.stream.log
        try:
            await log.sync()
        finally:
            self._streams_syncing.discard(queue)
        if log.durable_next >= log.next_offset:
            self.streams_unsynced.discard(queue)
        queue.stream.apply_retention(int(time.time() * 1000), force=False)
        self.kick(queue)
        for listener in tuple(self.stream_synced_listeners):
            listener(queue)

    def stream_removed(self, queue: Queue) -> None:
        """The stream `queue` is gone: no sync round is due for it any more."""
        self.streams_unsynced.discard(queue)
        self._streams_syncing.discard(queue)

    def fail_queue(self, queue: Queue, reason: str) -> None:
        """The queue's data cannot be read: it refuses everything but deletion from now
        on, its consumers are cancelled, and the rest of the broker goes on."""
        if queue.cursor.damage_noted():  # records lost to bit rot: dropped, not a failure
            self.kick(queue)
            return
        logger.error(
            "vhost %s: queue %r failed: %s",
            self.name,
            queue.name,
            reason,
            extra={VHOST: self.name, QUEUE: queue.name},
        )
        queue.failed = reason
        queue.in_flow = False
        queue.window.release()
        consumers, queue.consumers = list(queue.consumers), []
        queue.turns.clear()
        queue.parked.clear()
        for consumer in consumers:
            consumer.cancel_by_broker()
        self.dirty.discard(queue)
        self.streams_unsynced.discard(queue)
