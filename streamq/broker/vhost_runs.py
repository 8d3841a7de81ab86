"""A vhost's publish hot path for runs: many messages with one exchange and routing key.

A fast publisher's read holds hundreds of publishes, nearly always to the same exchange
with the same routing key. `VHostRuns.publish_run` stores such a run with one route, one
log append (`SegmentLog.append_run`, records encoded in C) and one cursor append per
queue, instead of doing all of that per message (STYLE.md section 11; the profile and
the numbers are in docs/perf.md, "Publish runs").

It takes only the common case: queues without a length limit (streams included). For
anything else it declines, and the gateway publishes the run's messages one by one
through `VHost.publish`, which knows every rule. `VHost` mixes it in.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter

from streamq.broker.deadletter import EXPIRATION_FLAG_BYTE0
from streamq.broker.priority import PRIORITY_FLAG_BYTE0, message_priority
from streamq.broker.queue import Queue
from streamq.broker.vhost_schedule import Schedule
from streamq.log.log import RunMessage, SegmentLog


class VHostRuns:
    """Mixed into `VHost`; the attributes below are the vhost's."""

    log: SegmentLog
    schedule: Schedule
    stream_appended: Callable[[Queue], None]

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
                    self.stream_appended(queue)
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
            [message_priority(m[0]) if m[0][0] & PRIORITY_FLAG_BYTE0 else 0 for m in messages]
            if flags & PRIORITY_FLAG_BYTE0
            else None
        )
        expiring = bool(flags & EXPIRATION_FLAG_BYTE0)
        count = len(messages)
        dirty = self.schedule.dirty
        was_idle = not dirty
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


_BODY = itemgetter(1)


def _or_first_bytes(messages: list[RunMessage]) -> int:
    """The OR of the first property flag byte of every message."""
    flags = 0
    for message in messages:
        flags |= message[0][0]
    return flags
