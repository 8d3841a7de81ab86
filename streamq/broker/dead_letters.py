"""At-least-once dead-lettering: the dead letters a queue holds until its targets have them.

Owns, for one vhost, the dead letters of its at-least-once queues (RabbitMQ 3.10's quorum
queues with dead-letter strategy `at-least-once`, overflow `reject-publish` and a
dead-letter exchange: `deadletter.at_least_once`), from their death until every queue
their copy routes to holds it durably. Meanwhile the source queue keeps the message: its
cursor holds it apart (`ClassicQueue.dead`, recorded in its journal, so that a restart
brings it back), offers it to no consumer and counts it against its length limits, as
RabbitMQ's quorum queues do.

It works as RabbitMQ's dead-letter worker (rabbit_fifo_dlx_worker): a copy goes at once
to each target that takes it. A target that refuses it (full, with a reject-publish
overflow), a dead-letter exchange that does not exist, or no route at all (cycles left
out) leave the message held, and it is sent again every `RETRY_INTERVAL_MS` to the
targets that do not have it yet (RabbitMQ's `dead_letter_worker_publisher_confirm_timeout`,
3 minutes by default). Once every target took it and the logs that hold the copies have
made them durable, the source lets it go (the release is itself durable a sync round
later). A restart sends every message still held again, to all its targets: those that
had it before the restart get it twice, as from RabbitMQ, whose worker keeps the
confirms it received in memory only. A queue that stops being at-least-once (a policy
change) drops what it held, as RabbitMQ deletes the messages not yet confirmed then.

It knows no AMQP (the copy's properties come from the gateway's `PropertiesCodec`, which
the `Router` holds) and never blocks: the housekeeping tick calls `tick`, which does a
bounded amount of work. A copy is routed by the vhost's `Router` and published by its
`Publisher`, like any publish; the `Settler` (`vhost_settle.py`) owns this object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from streamq.broker.deadletter import dead_letter_copy
from streamq.broker.delivery import MessageUnreadable, read_message
from streamq.broker.queue import Queue
from streamq.broker.vhost_publish import Publisher
from streamq.broker.vhost_routing import Router
from streamq.broker.vhost_schedule import Schedule
from streamq.log.errors import ReadFailed
from streamq.log.format import Record
from streamq.log.log import SegmentLog
from streamq.queues.journal import dead_mark, dead_of

logger = logging.getLogger(__name__)

RETRY_INTERVAL_MS: Final = 1000  # between two sends of a dead letter some target refused
# Expired messages an at-least-once queue dead-letters per expiry pass: each is sent on
# its own (no shared splice and route, as at-most-once runs have), about 90 us, so a
# large expired head goes over several housekeeping ticks, not in one long stall.
HOLDS_PER_EXPIRY_MAX: Final = 1024
# Dead letters sent again per vhost per tick: each reads its message back from the log,
# so a backlog held by a full target costs the event loop a bounded slice per tick.
SENDS_PER_TICK_MAX: Final = 256


@dataclass(slots=True)
class HeldDeadLetter:
    """One dead letter a queue holds, and where its copies went."""

    offset: int  # of the message in the vhost's log
    reason: str
    time_s: int  # of its death, as x-death records it
    sent_to: set[str] = field(default_factory=set)  # target queues that took a copy
    # The logs that hold the copies, and the `next_offset` each had after its copy.
    copies: list[tuple[SegmentLog, int]] = field(default_factory=list)
    retry_at_ms: int | None = 0  # when to send again; None: every target took it


class QueueDeadLetters:
    """The dead letters one queue holds, in two dicts (insertion ordered): those every
    target took, until their copies are durable (a sync round: few), and those to send
    again, in the order of their next attempt (each goes to the back when tried), so
    that a tick looks at the due ones only: O(attempts), not O(held)."""

    __slots__ = ("retry", "sent")

    def __init__(self) -> None:
        self.sent: dict[int, HeldDeadLetter] = {}
        self.retry: dict[int, HeldDeadLetter] = {}

    def __len__(self) -> int:
        return len(self.sent) + len(self.retry)

    def file(self, held: HeldDeadLetter) -> None:
        """Put `held` where its state says, at the back."""
        self.sent.pop(held.offset, None)
        self.retry.pop(held.offset, None)
        (self.sent if held.retry_at_ms is None else self.retry)[held.offset] = held


class DeadLetters:
    """The dead letters held by the at-least-once queues of one vhost."""

    __slots__ = ("_logged", "_publisher", "_router", "_schedule", "drain", "held", "name")

    def __init__(self, router: Router, publisher: Publisher, schedule: Schedule) -> None:
        self.name = publisher.name
        self._router = router  # routes the copies; the registry; the gateway's codec
        self._publisher = publisher  # publishes the copies; the vhost's log
        self._schedule = schedule  # fails (holds back, for EIO) a queue it cannot read
        # Wired in by the vhost (delivery is a component above this one): a drain round.
        self.drain: Callable[[], None] = _unwired
        self.held: dict[Queue, QueueDeadLetters] = {}
        self._logged: set[tuple[str, str]] = set()  # (queue, problem) warned about once

    @property
    def count(self) -> int:
        return sum(len(entries) for entries in self.held.values())

    def hold(
        self, queue: Queue, offset: int, reason: str, now_ms: int, *, taken: Record | None = None
    ) -> bool:
        """Dead-letter the message at `offset` of `queue` at least once: in flight
        (`taken` None), or just taken from the cursor with its record `taken`. The queue
        holds it until every target has it; its copy goes out now where it can. Returns
        False when the message in flight could not be read for an I/O error (EIO): it
        is still in flight, for the caller to requeue."""
        record = taken
        if record is None:
            try:
                record = read_message(self._publisher.log, offset)
            except MessageUnreadable as exc:
                self._schedule.unreadable(queue, exc)
                return not isinstance(exc.__cause__, ReadFailed)
        time_s = now_ms // 1000
        size = None if taken is None else len(record.body)
        if not queue.cursor.hold_dead(offset, size, dead_mark(reason, time_s)):
            return True  # no longer in flight: settled meanwhile
        held = HeldDeadLetter(offset, reason, time_s)
        self._send(queue, held, record, now_ms)
        self.held.setdefault(queue, QueueDeadLetters()).file(held)
        return True

    @staticmethod
    def bounded(expired: Callable[[int], Record | None]) -> Callable[[int], Record | None]:
        """`expired` (an expiry check of `VHost._expire_head`) that says "not expired"
        once it has said "expired" HOLDS_PER_EXPIRY_MAX times."""
        left = [HOLDS_PER_EXPIRY_MAX]

        def check(offset: int) -> Record | None:
            if left[0] <= 0:
                return None
            record = expired(offset)
            if record is not None:
                left[0] -= 1
            return record

        return check

    def restore(self, queue: Queue, marks: Mapping[int, int]) -> None:
        """Start-up: `queue`'s journal says it holds these dead letters (offset: mark);
        they leave the ready order and are sent again at the first tick. Raises
        LogError when a message cannot be read."""
        entries = self.held.setdefault(queue, QueueDeadLetters())
        for offset, mark in sorted(marks.items()):
            size = len(self._publisher.log.read_record(offset).body)
            if queue.cursor.restore_dead(offset, size, mark):
                reason, time_s = dead_of(mark)
                entries.file(HeldDeadLetter(offset, reason, time_s))
        if not entries:
            del self.held[queue]

    def drop(self, queue: Queue) -> None:
        """`queue` no longer dead-letters at least once: it lets go of what it held."""
        entries = self.held.pop(queue, None)
        for offset in list(queue.cursor.dead):
            queue.cursor.release_dead(offset)
        if entries:
            logger.warning(
                "vhost %s: queue %r dropped %d dead letters not yet confirmed "
                "(no longer at-least-once)",
                self.name,
                queue.name,
                len(entries),
            )

    def tick(self, now_ms: int) -> int:
        """Release the dead letters whose copies are all durable, and send again those
        due (SENDS_PER_TICK_MAX at most). Returns how many were released."""
        released = 0
        budget = SENDS_PER_TICK_MAX
        for queue, entries in list(self.held.items()):
            if self._router.queues.get(queue.name) is not queue or queue.failed is not None:
                del self.held[queue]  # deleted, or failed: what it held went with it
                continue
            for held in list(entries.sent.values()):
                if all(log.durable_next >= end for log, end in held.copies):
                    queue.cursor.release_dead(held.offset)
                    del entries.sent[held.offset]
                    released += 1
            budget = self._send_due(queue, entries, now_ms, budget)
            if not entries:
                self.held.pop(queue, None)
        return released

    def _send_due(self, queue: Queue, entries: QueueDeadLetters, now_ms: int, budget: int) -> int:
        """Send again the dead letters of `queue` whose time has come, within `budget`
        attempts; returns what is left of it."""
        while entries.retry and budget > 0:
            held = next(iter(entries.retry.values()))
            if held.retry_at_ms is not None and held.retry_at_ms > now_ms:
                break  # the rest come later still
            budget -= 1
            try:
                record = read_message(self._publisher.log, held.offset)
            except MessageUnreadable as exc:  # EIO: sent again at a later tick
                self._schedule.unreadable(queue, exc)
                break
            if self._send(queue, held, record, now_ms):
                # Hand the copy to the target's consumers now, as a publish is handed
                # on arrival, so that it no longer counts against the target's limit
                # when the next dead letter tries it.
                self.drain()
            entries.file(held)
        return budget

    def _send(self, queue: Queue, held: HeldDeadLetter, record: Record, now_ms: int) -> bool:
        """Publish the copy to the targets that do not have it and take it now; returns
        whether it went to any."""
        router, publisher = self._router, self._publisher
        held.retry_at_ms = now_ms + RETRY_INTERVAL_MS
        exchange_name = queue.dead_letter_exchange
        codec = router.properties_codec
        if exchange_name is None or codec is None or exchange_name not in router.exchanges:
            self._warn(queue, f"its dead-letter exchange {exchange_name!r} does not exist")
            return False
        copy = dead_letter_copy(
            codec,
            queue,
            record,
            held.reason,
            held.time_s,
            router.dead_letter_route(exchange_name),
        )
        if not copy.targets:
            if held.sent_to:
                # As RabbitMQ: the routes changed after a target took it: done.
                held.retry_at_ms = None
            else:
                self._warn(queue, f"its dead letters route to no queue from {exchange_name!r}")
            return False
        due = [q for q in copy.targets if q.name not in held.sent_to]
        size = len(record.body)
        taking = [q for q in due if not q.refuses(size)]
        if taking:
            publisher.publish(
                exchange_name, copy.routing_key, copy.properties, record.body, taking, now_ms
            )
            held.sent_to.update(q.name for q in taking)
            held.copies.append((publisher.log, publisher.log.next_offset))
            for target in taking:
                if target.stream is not None:
                    held.copies.append((target.stream.log, target.stream.log.next_offset))
        if len(taking) == len(due):
            held.retry_at_ms = None
        return bool(taking)

    def _warn(self, queue: Queue, problem: str) -> None:
        """Log a reason why a queue's dead letters stay held, once per queue."""
        if (queue.name, problem) not in self._logged:
            self._logged.add((queue.name, problem))
            logger.warning(
                "vhost %s: queue %r holds dead letters (at-least-once): %s",
                self.name,
                queue.name,
                problem,
            )


def _unwired() -> None:
    raise AssertionError("the vhost wires this in before the first tick")
