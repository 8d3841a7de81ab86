"""A virtual host: its exchanges, queues and bindings, and the routing of messages.

Owns the entity registry of one vhost, the shared message log of its classic queues
(each routed message is appended once, whatever the number of queues it goes to), the
contents of messages still held by some queue, and the hand-over of ready messages to
consumers. It is synchronous and single-threaded; the gateway calls `drain` when the vhost
asks for it through `wakeup`, so that deliveries are batched per event-loop turn.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Final

from streamq.broker.errors import AccessRefused, NotFound, PreconditionFailed, ResourceLocked
from streamq.broker.exchange import Destination, Exchange
from streamq.broker.queue import Consumer, Queue, StoredMessage
from streamq.log.format import Message
from streamq.log.log import SegmentLog
from streamq.log.syncer import Syncer

PREDECLARED: Final = (
    ("", "direct"),
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)
DRAIN_DELIVERIES_MAX: Final = 4096  # per queue per drain, so one queue cannot starve others
ROUTE_DEPTH_MAX: Final = 64  # exchange-to-exchange hops followed for one message


class VHost:
    def __init__(self, name: str, directory: str, syncer: Syncer) -> None:
        self.name = name
        self.directory = directory
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self.messages: dict[int, StoredMessage] = {}
        self.log = SegmentLog.open(os.path.join(directory, "messages"), syncer=syncer)
        self.dirty: set[Queue] = set()
        self.wakeup: Callable[[], None] = lambda: None
        for exchange_name, exchange_type in PREDECLARED:
            self.exchanges[exchange_name] = Exchange(
                exchange_name, exchange_type, True, False, False, {}
            )

    # -- exchanges -------------------------------------------------------------------------

    def exchange(self, name: str) -> Exchange:
        found = self.exchanges.get(name)
        if found is None:
            raise NotFound("exchange", name, self.name)
        return found

    def declare_exchange(
        self,
        name: str,
        exchange_type: str,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Mapping[str, object],
    ) -> None:
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise NotFound("exchange", name, self.name)
            return
        if name.startswith("amq.") and existing is None:
            raise AccessRefused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        if existing is not None:
            existing.check_equivalent(
                exchange_type, durable, auto_delete, internal, arguments, self.name
            )
            return
        self.exchanges[name] = Exchange(
            name, exchange_type, durable, auto_delete, internal, arguments
        )

    def delete_exchange(self, name: str, if_unused: bool) -> None:
        if name == "" or name.startswith("amq."):
            raise AccessRefused(f"operation not permitted on exchange '{name}'")
        exchange = self.exchanges.get(name)
        if exchange is None:
            return  # RabbitMQ: deleting a missing exchange succeeds
        if if_unused and (exchange.bindings or self._bound_as_destination(name)):
            raise PreconditionFailed(f"exchange '{name}' in vhost '{self.name}' in use")
        del self.exchanges[name]
        for other in self.exchanges.values():
            other.unbind_destination(Destination("exchange", name))

    def _bound_as_destination(self, name: str) -> bool:
        target = Destination("exchange", name)
        return any(b.destination == target for e in self.exchanges.values() for b in e.bindings)

    def bind(
        self,
        destination: Destination,
        source: str,
        routing_key: str,
        arguments: Mapping[str, object],
    ) -> None:
        if source == "":
            raise AccessRefused("operation not permitted on the default exchange")
        exchange = self.exchange(source)
        self._check_destination(destination)
        exchange.bind(destination, routing_key, arguments)

    def unbind(
        self,
        destination: Destination,
        source: str,
        routing_key: str,
        arguments: Mapping[str, object],
    ) -> None:
        if source == "":
            raise AccessRefused("operation not permitted on the default exchange")
        exchange = self.exchange(source)
        self._check_destination(destination)
        exchange.unbind(destination, routing_key, arguments)
        if exchange.auto_delete and not exchange.bindings:
            del self.exchanges[source]

    def _check_destination(self, destination: Destination) -> None:
        if destination.kind == "queue":
            if destination.name not in self.queues:
                raise NotFound("queue", destination.name, self.name)
        else:
            self.exchange(destination.name)

    # -- queues ----------------------------------------------------------------------------

    def queue(self, name: str, owner: object | None = None) -> Queue:
        """The queue `name`, checking that `owner` may use it if it is exclusive."""
        found = self.queues.get(name)
        if found is None:
            raise NotFound("queue", name, self.name)
        if found.exclusive_owner is not None and found.exclusive_owner is not owner:
            raise ResourceLocked(
                f"cannot obtain exclusive access to locked queue '{name}' in vhost '{self.name}'. "
                "It could be originally declared on another connection or the exclusive "
                "property value does not match that of the original declaration."
            )
        return found

    def declare_queue(
        self,
        name: str,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: Mapping[str, object],
        owner: object,
    ) -> Queue:
        if passive:
            return self.queue(name, owner)
        if name == "":
            name = "amq.gen-" + secrets.token_urlsafe(16)
        elif name.startswith("amq."):
            raise AccessRefused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        existing = self.queues.get(name)
        if existing is not None:
            self.queue(name, owner)  # the exclusive check
            existing.check_equivalent(durable, exclusive, auto_delete, arguments, self.name)
            return existing
        queue = Queue(name, durable, owner if exclusive else None, auto_delete, arguments)
        self.queues[name] = queue
        return queue

    def delete_queue(self, name: str, if_unused: bool, if_empty: bool, owner: object) -> int:
        """Delete the queue; returns how many ready messages it held."""
        queue = self.queue(name, owner)
        if if_unused and queue.consumers:
            raise PreconditionFailed(f"queue '{name}' in vhost '{self.name}' in use")
        if if_empty and queue.cursor.message_count:
            raise PreconditionFailed(f"queue '{name}' in vhost '{self.name}' is not empty")
        return self.remove_queue(queue)

    def remove_queue(self, queue: Queue) -> int:
        count = queue.cursor.message_count
        del self.queues[queue.name]
        self.dirty.discard(queue)
        for offset in queue.cursor.offsets():
            self.release(offset)
        destination = Destination("queue", queue.name)
        for exchange in list(self.exchanges.values()):
            removed = exchange.unbind_destination(destination)
            if removed and exchange.auto_delete and not exchange.bindings:
                del self.exchanges[exchange.name]
        return count

    def purge_queue(self, name: str, owner: object) -> int:
        queue = self.queue(name, owner)
        purged = queue.cursor.purge()
        for offset in purged:
            self.release(offset)
        return len(purged)

    # -- messages --------------------------------------------------------------------------

    def route(
        self, exchange_name: str, routing_key: str, headers: Mapping[str, object] | None
    ) -> list[Queue]:
        """The queues a message goes to. Raises NotFound for a missing exchange."""
        if exchange_name == "":
            queue = self.queues.get(routing_key)
            return [queue] if queue is not None else []
        start = self.exchange(exchange_name)
        found: set[Destination] = set()
        seen = {exchange_name}
        pending = [start]
        depth = 0
        while pending and depth < ROUTE_DEPTH_MAX:
            exchange = pending.pop()
            depth += 1
            matched: set[Destination] = set()
            exchange.route(routing_key, headers, matched)
            if not matched and exchange.alternate_exchange not in (None, *seen):
                alternate = self.exchanges.get(exchange.alternate_exchange or "")
                if alternate is not None:
                    seen.add(alternate.name)
                    pending.append(alternate)
            for destination in matched:
                if destination.kind == "queue":
                    found.add(destination)
                elif destination.name not in seen:
                    seen.add(destination.name)
                    target = self.exchanges.get(destination.name)
                    if target is not None:
                        pending.append(target)
        queues = self.queues
        return [queues[d.name] for d in found if d.name in queues]

    def publish(
        self,
        exchange_name: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
        queues: list[Queue],
    ) -> int | None:
        """Append a routed message once and give its offset to every queue; None if it
        went nowhere. Buffered: durable after `sync()`."""
        if not queues:
            return None
        message = Message(exchange_name.encode(), routing_key.encode(), properties_raw, body)
        offset = self.log.append([message], int(time.time() * 1000))
        self.messages[offset] = StoredMessage(
            offset, exchange_name, routing_key, properties_raw, body, len(queues)
        )
        size = len(body)
        dirty = self.dirty
        was_idle = not dirty
        for queue in queues:
            queue.cursor.enqueue(offset, size)
            if queue.consumers:
                dirty.add(queue)
        if was_idle and dirty:
            self.wakeup()
        return offset

    def release(self, offset: int) -> None:
        """One queue is done with the message at `offset`."""
        stored = self.messages.get(offset)
        if stored is not None:
            stored.refs -= 1
            if stored.refs <= 0:
                del self.messages[offset]

    def settle(self, queue: Queue, offset: int) -> None:
        """The message left `queue` for good (acked, or rejected without requeue)."""
        queue.cursor.ack(offset)
        self.release(offset)

    def requeue(self, queue: Queue, offset: int) -> None:
        if queue.name in self.queues:
            queue.cursor.requeue(offset)
            self.kick(queue)
        else:
            self.release(offset)

    def kick(self, queue: Queue) -> None:
        """Ask for a drain of `queue` (it has new messages or its consumers new credit)."""
        if queue.consumers and queue.cursor.message_count:
            was_idle = not self.dirty
            self.dirty.add(queue)
            if was_idle:
                self.wakeup()

    def collect_segments(self) -> int:
        """Delete log segments that no queue needs any more; returns how many.

        A segment goes when every offset in it is below the lowest offset any queue still
        holds (ready or unacked). The deletion is durable after the next sync round.
        """
        low = self.log.next_offset
        for queue in self.queues.values():
            needed = queue.cursor.low_water_offset()
            if needed is not None and needed < low:
                low = needed
        return self.log.drop_segments_before(low)

    async def sync(self) -> int:
        """Make every published message durable (group commit with all other callers)."""
        return await self.log.sync()

    # -- consumers -------------------------------------------------------------------------

    def add_consumer(self, queue: Queue, consumer: Consumer) -> None:
        if any(c.exclusive for c in queue.consumers):
            raise AccessRefused(f"queue '{queue.name}' in vhost '{self.name}' in exclusive use")
        if consumer.exclusive and queue.consumers:
            raise AccessRefused(f"queue '{queue.name}' in vhost '{self.name}' in exclusive use")
        queue.consumers.append(consumer)
        queue.had_consumers = True
        self.kick(queue)

    def remove_consumer(self, queue: Queue, consumer: Consumer) -> None:
        if consumer in queue.consumers:
            queue.consumers.remove(consumer)
        if queue.auto_delete and not queue.consumers and queue.name in self.queues:
            self.remove_queue(queue)

    def drain(self) -> None:
        """Hand ready messages to consumers with credit, round robin per queue."""
        dirty = self.dirty
        self.dirty = set()
        for queue in dirty:
            self._drain_queue(queue)

    def _drain_queue(self, queue: Queue) -> None:
        consumers = queue.consumers
        count = len(consumers)
        if not count:
            return
        take = queue.cursor.take
        messages = self.messages
        index = queue.next_consumer
        idle = 0
        delivered = 0
        # Hot path: one loop per queue and drain, no task or callback per message.
        while idle < count:
            consumer = consumers[index % count]
            index += 1
            if not consumer.can_take():
                idle += 1
                continue
            ready = take()
            if ready is None:
                break
            idle = 0
            consumer.deliver(queue, ready, messages[ready.offset])
            if consumer.no_ack:
                self.settle(queue, ready.offset)
            delivered += 1
            if delivered >= DRAIN_DELIVERIES_MAX:
                self.kick(queue)
                break
        queue.next_consumer = index % count

    def close(self) -> None:
        self.log.close_blocking()
