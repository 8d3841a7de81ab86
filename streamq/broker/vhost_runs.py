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

from streamq.broker.deadletter import EXPIRATION_FLAG_BYTE0
from streamq.broker.paging import Pager
from streamq.broker.priority import PRIORITY_FLAG_BYTE0, message_priority
from streamq.broker.queue import Queue, StoredMessage
from streamq.log.log import RunMessage, SegmentLog


class VHostRuns:
    """Mixed into `VHost`; the attributes below are the vhost's."""

    log: SegmentLog
    messages: dict[int, StoredMessage]
    pager: Pager
    dirty: set[Queue]
    wakeup: Callable[[], None]
    stream_appended: Callable[[Queue], None]

    def publish_run(
        self,
        exchange_name: str,
        routing_key: str,
        messages: list[RunMessage],
        queues: list[Queue],
        timestamp_ms: int,
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
        refs = len(queues)
        stored = self.messages
        sizes: list[int] = []
        add_size = sizes.append
        flags = 0
        offset = first
        # Per message: one StoredMessage, its size, and the OR of the property flags
        # that matter here (a property list has at least its two flag bytes).
        for message in messages:
            properties_raw, body = message[0], message[1]
            stored[offset] = StoredMessage(
                offset, exchange_name, routing_key, properties_raw, body, refs, timestamp_ms
            )
            add_size(len(body))
            flags |= properties_raw[0]
            offset += 1
        pager = self.pager  # bodies leave memory past its budget (paging.py)
        pager.resident_bytes += sum(sizes)
        pager.order.extend(range(first, offset))
        priorities = (
            [message_priority(m[0]) if m[0][0] & PRIORITY_FLAG_BYTE0 else 0 for m in messages]
            if flags & PRIORITY_FLAG_BYTE0
            else None
        )
        count = len(messages)
        dirty = self.dirty
        was_idle = not dirty
        for queue in queues:
            if flags & EXPIRATION_FLAG_BYTE0:
                queue.holds_expiring = True
            queue.cursor.enqueue_run(first, sizes, priorities)
            queue.stats.publish += count
            if queue.consumers:
                dirty.add(queue)
        if was_idle and dirty:
            self.wakeup()
        return True
