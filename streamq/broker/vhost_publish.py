"""A vhost's publish side: storing routed messages once and handing them to their queues.

Owns the append of each routed message to the vhost's log (once, whatever the number of
queues it goes to) and to the logs of the streams it goes to, the queues' cursors taking
its offset, and what a publish must check on the way: length limits (a full queue in a
reject-publish mode refuses it: `publish_rejected`), deduplication caches of queues
declared with `x-message-deduplication` (`dedup.py`; an exchange keeps its own), and
messages of `x-delayed-message` exchanges that wait out their `x-delay` (`DelayedStore`,
`delayed.py`). It tells the schedule which queues are due a drain.

The run path: a fast publisher's read holds hundreds of publishes, nearly always to the
same exchange with the same routing key. `publish_run` stores such a run with one log
append (`SegmentLog.append_run`, records encoded in C) and one cursor append per queue,
instead of doing all of that per message (STYLE.md section 11; the profile and the
numbers are in docs/perf.md, "Publish runs"). It takes only the common case, queues
without a length limit (streams included); for anything else it declines, and the
gateway publishes the run's messages one by one through `publish`, which knows every
rule.

It does not route or decode messages: the gateway routes (`Router`), and reads headers
and routes the delayed messages that come due, so that everything a publish does
(CC/BCC, alternate exchanges) applies then too. What a publish sets off above it (a
queue with consumers drained before its limit counts, drop-head and reject-publish-dlx
dead letters) it calls through the three callables the vhost wires in (`drain_queue`,
`drop_head`, `dead_letter_record`): this module imports no component above it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from operator import itemgetter

from streamq.broker.dedup import Deduper, deduper_for
from streamq.broker.delayed import DelayedMessage, DelayedStore
from streamq.broker.errors import BrokerError
from streamq.broker.exchange import Exchange
from streamq.broker.expiration import EXPIRY_NONE, deadline_ms, lower_bound
from streamq.broker.priority import message_priority
from streamq.broker.queue import Queue
from streamq.broker.raw_properties import EXPIRATION_FLAG, PRIORITY_FLAG
from streamq.broker.vhost_schedule import Schedule
from streamq.log.format import Record
from streamq.log.log import RunMessage, SegmentLog

logger = logging.getLogger(__name__)

DELAYED_FILE = "delayed"


class Publisher:
    """The publish side of one vhost."""

    __slots__ = (
        "dead_letter_record",
        "delayed",
        "drain_queue",
        "drop_head",
        "log",
        "name",
        "on_delay",
        "publish_rejected",
        "queue_dedupers",
        "schedule",
        "stream_count",
    )

    def __init__(self, name: str, directory: str, log: SegmentLog, schedule: Schedule) -> None:
        """Open the delayed messages' file (blocking: start-up only; `restore` follows).
        Raises OSError."""
        self.name = name
        self.log = log  # the vhost's (Storage's): classic queues' messages
        self.schedule = schedule
        self.stream_count = 0  # of the vhost's queues, how many are streams
        self.publish_rejected = False  # the last publish was refused by a full queue
        self.queue_dedupers: dict[str, Deduper] = {}
        # The gateway's timer: called with a deadline nearer than any before it.
        self.on_delay: Callable[[int], None] = _no_timer
        self.delayed = DelayedStore.open(os.path.join(directory, DELAYED_FILE))
        log.add_sync_companion(self.delayed.prepare_sync)
        # Wired in by the vhost: what a publish sets off in the components above this one.
        self.drain_queue: Callable[[Queue], None] = _unwired
        self.drop_head: Callable[[Queue, int], None] = _unwired
        self.dead_letter_record: Callable[[Queue, Record, str, int], object] = _unwired

    def restore(self, exchanges: Mapping[str, Exchange], queues: Iterable[Queue]) -> None:
        """Drop the delayed messages whose exchange is gone and build the queues'
        deduplication caches (empty: they live in memory only). Start-up only: may
        rewrite and fsync the delayed file."""
        orphans = {
            m.exchange
            for m in self.delayed.messages()
            if not _keeps_delayed(exchanges.get(m.exchange))
        }
        for exchange in orphans:
            self.delayed.drop_exchange(exchange)
        if len(self.delayed):
            logger.info("vhost %s: restored %d delayed messages", self.name, len(self.delayed))
        for queue in queues:
            try:
                deduper = deduper_for(queue.arguments)
            except BrokerError:
                continue
            if deduper is not None:
                self.queue_dedupers[queue.name] = deduper

    def publish(
        self,
        exchange_name: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
        queues: list[Queue],
        timestamp_ms: int | None = None,
    ) -> int | None:
        """Append a routed message once and give its offset to every queue; None if it
        went nowhere. Buffered: durable after `sync()`. The gateway passes one
        `timestamp_ms` for all the messages of one read. Sets `publish_rejected` for
        this publish alone: the gateway nacks it when a full queue refused it."""
        # First of all: a publish that goes nowhere, or only to streams, returns early,
        # and must not inherit the refusal of the publish before it (any channel's).
        self.publish_rejected = False
        if not queues:
            return None
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        if self.stream_count:
            # A loop, not any() over a generator: this test runs for every publish while
            # the vhost has a stream (the generator cost about 1 us per message).
            for queue in queues:
                if queue.stream is not None:
                    stream_offset = self._append_to_streams(
                        queues, exchange_name, routing_key, properties_raw, body, timestamp_ms
                    )
                    if len(queues) == 1:
                        return stream_offset
                    queues = [q for q in queues if q.stream is None]
                    if not queues:
                        return stream_offset
                    break
        limited: list[Queue] = []
        # A loop finds that no queue has a length limit (the common case) without the
        # list comprehension, a function call per publish.
        for queue in queues:
            if queue.max_length is not None or queue.max_length_bytes is not None:
                limited = [
                    q for q in queues if q.max_length is not None or q.max_length_bytes is not None
                ]
                queues = self._refuse_when_full(
                    limited, queues, exchange_name, routing_key, properties_raw, body, timestamp_ms
                )
                if not queues:
                    return -1  # routed, but every queue refused it (not a mandatory return)
                break
        offset = self.log.append_one(
            exchange_name.encode(), routing_key.encode(), properties_raw, body, timestamp_ms
        )
        size = len(body)
        dirty = self.schedule.dirty
        was_idle = not dirty
        expiring = bool(properties_raw) and bool(properties_raw[0] & EXPIRATION_FLAG)
        if expiring:
            for queue in queues:
                queue.holds_expiring = True
            lower_bound(queues, deadline_ms(properties_raw, timestamp_ms))
        # Only a message with a priority pays for reading it (priority queues use it).
        priority = (
            message_priority(properties_raw)
            if properties_raw and properties_raw[0] & PRIORITY_FLAG
            else 0
        )
        for queue in queues:
            queue.cursor.enqueue(offset, size, priority, expiring)
            queue.stats.publish += 1
            if queue.consumers:
                dirty.add(queue)
        rejected = self.publish_rejected
        for queue in limited:
            if queue.consumers:
                # A consumer with credit takes the message before it counts against the
                # limit, as RabbitMQ hands it over on arrival: without this, a burst of
                # publishes read at once would overflow (drop or refuse) what consumers
                # were about to take.
                self.drain_queue(queue)
            if queue.overflow == "drop-head":
                self.drop_head(queue, timestamp_ms)  # its dead letters publish too
        self.publish_rejected = rejected
        if was_idle and dirty:
            self.schedule.wakeup()
        return offset

    def _refuse_when_full(
        self,
        limited: list[Queue],
        queues: list[Queue],
        exchange_name: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
        timestamp_ms: int,
    ) -> list[Queue]:
        """The queues that take the message: full ones in a reject-publish mode refuse it
        (`publish_rejected` tells the gateway to nack it), and with reject-publish-dlx the
        refused copy is dead-lettered (reason maxlen)."""
        size = len(body)
        refused = [q for q in limited if q.overflow != "drop-head" and _over_limit(q, 1, size)]
        if not refused:
            return queues
        for queue in refused:
            if queue.overflow == "reject-publish-dlx":
                record = Record(
                    -1,
                    timestamp_ms,
                    exchange_name.encode(),
                    routing_key.encode(),
                    properties_raw,
                    body,
                )
                self.dead_letter_record(queue, record, "maxlen", timestamp_ms)
        self.publish_rejected = True  # after the dead letters, which publish themselves
        return [q for q in queues if q not in refused]

    def _append_to_streams(
        self,
        queues: list[Queue],
        exchange_name: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
        timestamp_ms: int,
    ) -> int:
        exchange_raw, routing_key_raw = exchange_name.encode(), routing_key.encode()
        offset = -1
        for queue in queues:
            if queue.stream is not None:
                offset = queue.stream.append(
                    exchange_raw, routing_key_raw, properties_raw, body, timestamp_ms
                )
                self.schedule.stream_appended(queue)
        return offset

    def publish_run(
        self,
        exchange_name: str,
        routing_key: str,
        messages: list[RunMessage],
        queues: list[Queue],
        timestamp_ms: int,
        flags_byte0: int | None = None,
    ) -> bool:
        """Append every message of `messages`, routed to `queues` (not empty), once to
        the log and give the offsets to every queue, in order; False, having done
        nothing, when a queue is a stream or has a length limit (publish them one by
        one then). Buffered: durable after `sync()`. Raises LogError."""
        streams = False
        for queue in queues:
            if queue.max_length is not None or queue.max_length_bytes is not None:
                return False
            streams = streams or queue.stream is not None
        exchange_raw, routing_key_raw = exchange_name.encode(), routing_key.encode()
        if streams:  # each stream has its own log
            for queue in queues:
                if queue.stream is not None:
                    queue.stream.append_run(exchange_raw, routing_key_raw, messages, timestamp_ms)
                    self.schedule.stream_appended(queue)
            queues = [q for q in queues if q.stream is None]
            if not queues:
                return True
        first = self.log.append_run(exchange_raw, routing_key_raw, messages, timestamp_ms)
        # No object is kept per message: the bodies' total size, and the OR of the first
        # property flag bytes (the scan of the read gives it; a property list has at least
        # its two flag bytes), both in C-level loops.
        size_bytes = sum(map(len, map(_BODY, messages)))
        flags = flags_byte0 if flags_byte0 is not None else _or_first_bytes(messages)
        priorities = (
            [message_priority(m[0]) if m[0][0] & PRIORITY_FLAG else 0 for m in messages]
            if flags & PRIORITY_FLAG
            else None
        )
        expiring = bool(flags & EXPIRATION_FLAG)
        count = len(messages)
        dirty = self.schedule.dirty
        was_idle = not dirty
        if expiring:
            # Only a run with expirations reads them, once per distinct property list (a
            # publisher's run usually has one): the set is built in C.
            own = min(
                deadline_ms(p, timestamp_ms) if p[0] & EXPIRATION_FLAG else EXPIRY_NONE
                for p in set(map(_PROPERTIES, messages))
            )
            lower_bound(queues, own)
        for queue in queues:
            if expiring:
                queue.holds_expiring = True
            queue.cursor.enqueue_run(first, count, size_bytes, priorities, expiring)
            queue.stats.publish += count
            if queue.consumers:
                dirty.add(queue)
        if was_idle and dirty:
            self.schedule.wakeup()
        return True

    def delay(
        self,
        exchange: Exchange,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
        deadline_ms: int,
        persistent: bool,
    ) -> None:
        """Hold a message of a delayed exchange until `deadline_ms`. Kept across a
        restart when the exchange is durable and the message persistent: buffered,
        durable after the next sync round."""
        keep = persistent and exchange.durable
        if self.delayed.add(exchange.name, routing_key, properties_raw, body, deadline_ms, keep):
            self.on_delay(deadline_ms)

    def due_delayed(self, now_ms: int) -> list[DelayedMessage]:
        """The delayed messages whose time has come, for the gateway to route."""
        if not len(self.delayed):
            return []
        return self.delayed.due(now_ms)

    def duplicate_free(
        self, queues: list[Queue], headers: Mapping[str, object] | None, now_ms: int
    ) -> list[Queue]:
        """The queues for which the message is no duplicate (their caches remember it)."""
        dedupers = self.queue_dedupers
        return [
            q
            for q in queues
            if (d := dedupers.get(q.name)) is None or not d.duplicate(headers, now_ms)
        ]

    def set_deduper(self, queue: Queue, deduper: Deduper | None) -> None:
        """Give `queue` its deduplication cache (None: it has none, or is deleted)."""
        if deduper is not None:
            self.queue_dedupers[queue.name] = deduper
        else:
            self.queue_dedupers.pop(queue.name, None)


def _keeps_delayed(exchange: Exchange | None) -> bool:
    # Not `exchange.delayed`: policies (LavinMQ's `delayed-message`) are applied later,
    # and a message held before its policy went away is still released.
    return exchange is not None and exchange.durable


def _no_timer(deadline_ms: int) -> None:
    pass


def _unwired(*args: object) -> None:
    raise AssertionError("the vhost wires this in before the first publish")


def _over_limit(queue: Queue, messages: int, size: int) -> bool:
    """Whether the queue would exceed a length limit with `messages` more ready messages
    of `size` bytes more (the dead letters it holds count, as in RabbitMQ)."""
    return queue.over_limit(messages, size)


_PROPERTIES = itemgetter(0)
_BODY = itemgetter(1)


def _or_first_bytes(messages: list[RunMessage]) -> int:
    """The OR of the first property flag byte of every message."""
    flags = 0
    for message in messages:
        flags |= message[0][0]
    return flags
