"""A vhost's schedule: the work it owes its gateway at the next event-loop turn.

Owns two sets and the gateway's wake-up call: the queues due a drain round (`dirty`:
new messages, or consumers with new credit) and the streams with appends not yet
durable (`streams_unsynced`, and those whose sync round is in flight). Whoever makes
work due (a publish, an ack, a requeue, a stream append) adds to it here and, when it
was idle, calls `wakeup` once: the gateway then runs `VHost.drain` and the streams'
sync rounds in its next loop turn, so that deliveries and fsyncs are batched per turn.

It also takes a failed queue out of all of it (`fail_queue`), and holds back for a while
the deliveries of a queue whose read met an I/O error (`unreadable`, `retry_reads`: the
disk's fault, which may heal, not the queue's). It is the lowest of the
vhost's components (see docs/architecture.md, "The vhost's components"): it imports
none of them and knows no AMQP; it never reads the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from streamq.broker.queue import Consumer, Queue
from streamq.log.errors import ReadFailed
from streamq.log_fields import QUEUE, VHOST

logger = logging.getLogger(__name__)

READ_RETRY_S: Final = 1.0
"""How long a queue whose read failed with an I/O error (EIO) waits before reading again
(`Schedule.unreadable`): one failed delivery, one cancelled consumer and one log line per
queue per interval at most while the fault lasts."""


class Schedule:
    """The queues due a drain and the streams due a sync round, of one vhost."""

    __slots__ = (
        "_streams_syncing",
        "dirty",
        "name",
        "read_held",
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
        # Queues whose last read failed with an I/O error, and when (time.monotonic())
        # they may read again: their drain rounds and expiry wait until then.
        self.read_held: dict[Queue, float] = {}
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
        queue.clear_turns()
        for consumer in consumers:
            consumer.cancel_by_broker()
        self.dirty.discard(queue)
        self.streams_unsynced.discard(queue)
        self.read_held.pop(queue, None)

    def unreadable(self, queue: Queue, exc: Exception, consumer: Consumer | None = None) -> None:
        """A message of `queue` could not be read (`exc`, a MessageUnreadable): an I/O
        error (ReadFailed, EIO) holds the queue's reads back (`read_failed`); anything
        else (damage, a missing record) fails the queue (`fail_queue`)."""
        if isinstance(exc.__cause__, ReadFailed):
            self.read_failed(queue, str(exc), consumer)
        else:
            self.fail_queue(queue, str(exc))

    def read_failed(self, queue: Queue, reason: str, consumer: Consumer | None = None) -> None:
        """A read of `queue`'s messages failed with an I/O error: the disk's fault, which
        may heal, so the queue does not fail. The message stays where it was (queued,
        not delivered, not acked); the consumer the delivery was for, if any, is
        cancelled (basic.cancel: its clear error; the queue's other consumers stay);
        the queue's deliveries and expiry wait READ_RETRY_S, then read again
        (`retry_reads`); publishing to it goes on."""
        cancelled = ""
        if consumer is not None and consumer in queue.consumers:
            queue.consumers.remove(consumer)
            queue.leave(consumer)
            consumer.cancel_by_broker()
            cancelled = f"its consumer {consumer.tag!r} cancelled, "
        logger.warning(
            "vhost %s: queue %r: %s; %sthe message stays queued, read again in %.1f s",
            self.name,
            queue.name,
            reason,
            cancelled,
            READ_RETRY_S,
        )
        queue.window.release()
        queue.in_flow = False
        self.read_held[queue] = time.monotonic() + READ_RETRY_S
        self.dirty.discard(queue)

    def retry_reads(self, now_s: float) -> None:
        """Let the queues whose read failed READ_RETRY_S ago read again (a drain round
        each; the housekeeping timer calls it)."""
        for queue, until_s in list(self.read_held.items()):
            if until_s <= now_s:
                del self.read_held[queue]
                self.kick(queue)
