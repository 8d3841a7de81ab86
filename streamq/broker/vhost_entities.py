"""A vhost's entities: its exchanges, queues and the bindings between them.

Owns the registry of one vhost (`exchanges` and `queues` by name; an exchange holds its
bindings, `exchange.py`) and every change to it: declaring, deleting, binding, unbinding
and purging, as RabbitMQ checks them (reserved names, equivalence, exclusive owners,
`if-unused`, `if-empty`, auto-delete), queues deleted after their `x-expires`, and the
followers of those changes (`binding_listeners`, `stream_removed_listeners`). A durable
change is recorded in the definitions journal (`Storage`) and replayed from it at
start-up (`restore`, `ops` for a compaction's snapshot). A new entity gets its policy
from the `PolicySet`, a new durable classic queue its journal and a new stream its log
from `Storage`, a queue its deduplication cache from the `Publisher`; a deleted one
leaves all of them and the `Schedule`.

Routing over this registry is the `Router`'s (`vhost_routing.py`). The head of a queue
that expired is dropped on a declare through `expire_head`, which the vhost wires in
(settling is a component above this one). It knows no AMQP: errors are the broker's
domain errors (`errors.py`).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Final

from streamq.broker.account_limits import QueueLimitReached
from streamq.broker.dedup import deduper_for
from streamq.broker.errors import (
    AccessRefused,
    NotFound,
    PreconditionFailed,
    QueueUnavailable,
    ResourceLocked,
)
from streamq.broker.exchange import Binding, Destination, Exchange, freeze_arguments
from streamq.broker.queue import Queue, locked_text
from streamq.broker.queue_arguments import (
    STREAM,
    check_queue_arguments,
    check_queue_properties,
    with_default_queue_type,
)
from streamq.broker.stats import MessageStats
from streamq.broker.streams import check_stream_arguments
from streamq.broker.vhost_policies import PolicySet
from streamq.broker.vhost_publish import Publisher
from streamq.broker.vhost_schedule import Schedule
from streamq.broker.vhost_store import (
    PREDECLARED,
    Storage,
    binding_op,
    exchange_op,
    queue_op,
)

logger = logging.getLogger(__name__)

DEFAULT_EXCHANGE_REFUSED: Final = "operation not permitted on the default exchange"
_DEFAULT_EXCHANGE: Final = Destination("exchange", "")


class Entities:
    """The exchanges, queues and bindings of one vhost."""

    __slots__ = (
        "binding_listeners",
        "default_queue_type",
        "definitions",
        "exchanges",
        "expire_head",
        "name",
        "policy_set",
        "publisher",
        "queues",
        "retired_stats",
        "schedule",
        "storage",
        "stream_removed_listeners",
    )

    def __init__(
        self,
        name: str,
        storage: Storage,
        policy_set: PolicySet,
        publisher: Publisher,
        schedule: Schedule,
    ) -> None:
        """The predeclared exchanges alone; `restore` replays the rest."""
        self.name = name
        self.storage = storage
        self.definitions = storage.definitions
        self.policy_set = policy_set
        self.publisher = publisher
        self.schedule = schedule
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        # The type of a new queue declared without `x-queue-type` (the broker sets it from
        # the vhost's metadata); None: classic.
        self.default_queue_type: str | None = None
        self.retired_stats = MessageStats()  # the counts of deleted queues
        # Followers of entity changes (federation: streamq.links) get (source exchange,
        # binding, added) after a binding is added or removed, deleted ends included.
        self.binding_listeners: list[Callable[[str, Binding, bool], None]] = []
        # Followers of streams outside the AMQP gateway (stream_gateway): called with the
        # queue after a stream is removed.
        self.stream_removed_listeners: list[Callable[[Queue], None]] = []
        # Wired in by the vhost: dead-letter what expired at the head of a queue.
        self.expire_head: Callable[[Queue, int], int] = _unwired
        for exchange_name, exchange_type in PREDECLARED:
            self.exchanges[exchange_name] = Exchange(
                exchange_name, exchange_type, True, False, False, {}
            )

    def drop_exchange(self, name: str) -> None:
        """Remove exchange `name` and the bindings to it (no check, nothing recorded)."""
        exchange = self.exchanges.pop(name, None)
        if exchange is not None:
            self.unbind_everywhere(Destination("exchange", name))

    def unbind_everywhere(self, destination: Destination) -> list[Exchange]:
        """Remove every binding to `destination`; returns the exchanges that lost some."""
        if self.binding_listeners:
            for exchange in self.exchanges.values():
                for binding in [b for b in exchange.bindings if b.destination == destination]:
                    self._binding_changed(exchange.name, binding, added=False)
        return [e for e in self.exchanges.values() if e.unbind_destination(destination)]

    def _binding_changed(self, source: str, binding: Binding, *, added: bool) -> None:
        for listener in tuple(self.binding_listeners):
            listener(source, binding, added)

    def _auto_delete_exchange(self, exchange: Exchange) -> None:
        """An auto-delete exchange lost its last binding."""
        if exchange.auto_delete and not exchange.bindings and exchange.name in self.exchanges:
            self.drop_exchange(exchange.name)
            self.publisher.delayed.drop_exchange(exchange.name)
            if exchange.durable:
                self.definitions.record({"op": "exchange.delete", "name": exchange.name})

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
        user: str = "",
    ) -> None:
        """Declare exchange `name`, by `user` (kept as who declared it)."""
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
        exchange = Exchange(name, exchange_type, durable, auto_delete, internal, arguments)
        exchange.user = user
        self.exchanges[name] = exchange
        exchange.policy = self.policy_set.exchange_policy(name)
        if durable:
            self.definitions.record(exchange_op(exchange))

    def delete_exchange(self, name: str, if_unused: bool) -> None:
        if name == "":
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSED)
        if name.startswith("amq."):
            raise AccessRefused(
                f"deletion of system exchange '{name}' in vhost '{self.name}' not allowed"
            )
        exchange = self.exchanges.get(name)
        if exchange is None:
            return  # RabbitMQ: deleting a missing exchange succeeds
        # RabbitMQ: in use means a source of bindings; being a destination is no use.
        if if_unused and exchange.bindings:
            raise PreconditionFailed(f"exchange '{name}' in vhost '{self.name}' in use")
        self.drop_exchange(name)
        self.publisher.delayed.drop_exchange(name)
        if exchange.durable:
            self.definitions.record({"op": "exchange.delete", "name": name})

    def bind(
        self,
        destination: Destination,
        source: str,
        routing_key: str,
        arguments: Mapping[str, object],
    ) -> None:
        if source == "" or destination == _DEFAULT_EXCHANGE:
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSED)
        exchange = self.exchange(source)
        self._check_destination(destination)
        added = exchange.bind(destination, routing_key, arguments)
        if added and exchange.durable and self.persisted(destination):
            self.definitions.record(binding_op("bind", source, destination, routing_key, arguments))
        if added and self.binding_listeners:
            binding = Binding(destination, routing_key, freeze_arguments(arguments))
            self._binding_changed(source, binding, added=True)

    def unbind(
        self,
        destination: Destination,
        source: str,
        routing_key: str,
        arguments: Mapping[str, object],
    ) -> None:
        if source == "" or destination == _DEFAULT_EXCHANGE:
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSED)
        exchange = self.exchanges.get(source)
        if exchange is None or not self.exists(destination):
            return  # RabbitMQ: unbinding what does not exist succeeds
        removed = exchange.unbind(destination, routing_key, arguments)
        if removed and exchange.durable and self.persisted(destination):
            self.definitions.record(
                binding_op("unbind", source, destination, routing_key, arguments)
            )
        if removed and self.binding_listeners:
            binding = Binding(destination, routing_key, freeze_arguments(arguments))
            self._binding_changed(source, binding, added=False)
        self._auto_delete_exchange(exchange)

    def _check_destination(self, destination: Destination) -> None:
        if destination.kind == "queue":
            if destination.name not in self.queues:
                raise NotFound("queue", destination.name, self.name)
        else:
            self.exchange(destination.name)

    # -- queues ----------------------------------------------------------------------------

    def queue(self, name: str, owner: object | None = None, *, usable: bool = True) -> Queue:
        """The queue `name`, checking that `owner` may use it if it is exclusive, and,
        with `usable`, that it has not failed (a failed queue can only be deleted)."""
        found = self.queues.get(name)
        if found is None:
            raise NotFound("queue", name, self.name)
        if usable and found.failed is not None:
            raise QueueUnavailable(name, self.name, found.failed)
        if found.exclusive_owner is not None and found.exclusive_owner is not owner:
            raise ResourceLocked(locked_text(name, self.name))
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
        *,
        queue_max: int | None = None,
    ) -> Queue:
        """Declare a queue. `queue_max`: the vhost's max-queues in force, checked for a
        new queue only, after its name and equivalence and before its arguments (as
        rabbit_channel does); None where RabbitMQ does not check it (definitions imports,
        which count beforehand, and the stream protocol). Raises QueueLimitReached and
        the declare's other domain errors."""
        if passive:
            found = self.queue(name, owner)
            found.last_used_s = time.monotonic()  # a declare renews the x-expires lease
            self.expire_head(found, int(time.time() * 1000))  # not counted in declare-ok
            return found
        # RabbitMQ: an exclusive queue is never durable (rabbit_channel's queue.declare).
        durable = durable and not exclusive
        if name == "":
            name = "amq.gen-" + secrets.token_urlsafe(16)
        elif name.startswith("amq."):
            raise AccessRefused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        existing = self.queues.get(name)
        if existing is not None:
            self.queue(name, owner)  # the exclusive check
            existing.check_equivalent(durable, exclusive, auto_delete, arguments, self.name)
            existing.last_used_s = time.monotonic()  # a declare renews the x-expires lease
            self.expire_head(existing, int(time.time() * 1000))
            return existing
        if queue_max is not None and len(self.queues) >= queue_max:
            raise QueueLimitReached(name, self.name, queue_max)
        arguments = with_default_queue_type(
            arguments, self.default_queue_type, durable, exclusive, auto_delete
        )
        kind = check_queue_arguments(name, self.name, arguments)
        if kind == STREAM:
            check_stream_arguments(name, self.name, arguments)
        check_queue_properties(kind, name, self.name, durable, exclusive, auto_delete)
        deduper = deduper_for(arguments)
        queue = Queue(name, durable, owner if exclusive else None, auto_delete, arguments)
        self.publisher.set_deduper(queue, deduper)
        if kind == STREAM:
            queue.stream = self.storage.open_stream(queue)
            self.publisher.stream_count += 1
        self.queues[name] = queue
        self.policy_set.apply_policy(queue)
        if queue.persisted:
            self.definitions.record(queue_op(queue))
            if queue.stream is None:
                queue.attach_journal(self.storage.create_journal(name))
        return queue

    def delete_queue(self, name: str, if_unused: bool, if_empty: bool, owner: object) -> int:
        """Delete the queue; returns how many ready messages it held."""
        queue = self.queue(name, owner, usable=False)
        if if_unused and queue.consumers:
            raise PreconditionFailed(f"queue '{name}' in vhost '{self.name}' in use")
        if if_empty and queue.cursor.message_count:
            raise PreconditionFailed(f"queue '{name}' in vhost '{self.name}' not empty")
        return self.remove_queue(queue)

    def remove_queue(self, queue: Queue) -> int:
        count = queue.cursor.message_count
        self.retired_stats.add(queue.stats.counts())
        del self.queues[queue.name]
        queue.in_flow = False
        self.publisher.set_deduper(queue, None)
        self.schedule.dirty.discard(queue)
        queue.window.release()
        if queue.persisted:
            self.definitions.record({"op": "queue.delete", "name": queue.name})
        if queue.stream is not None:
            count = queue.stream.message_count
            queue.stream.log.discard()
            queue.stream.offsets.close()
            queue.stream.publishers.close()
            self.publisher.stream_count -= 1
        if queue.stream is not None or queue.arguments.get("x-queue-type") == STREAM:
            self.storage.delete_stream_files(queue)  # also a failed stream's
            self.schedule.stream_removed(queue)
            for listener in tuple(self.stream_removed_listeners):
                listener(queue)
        self.storage.remove_journal(queue)
        for exchange in self.unbind_everywhere(Destination("queue", queue.name)):
            self._auto_delete_exchange(exchange)
        return count

    def purge_queue(self, name: str, owner: object) -> int:
        queue = self.queue(name, owner)
        if queue.stream is not None:
            return 0  # a stream is not purged: retention drops its old segments
        purged = queue.cursor.purge()
        if not queue.cursor.unacked_count:
            queue.window.release()
        return purged

    def expire_queues(self, now_s: float) -> list[Queue]:
        """Delete the queues unused for their x-expires (monotonic `now_s`); returns
        them. The housekeeping timer calls it; deletions are durable after a sync round."""
        expired = [q for q in self.queues.values() if q.expired(now_s)]
        for queue in expired:
            logger.info("vhost %s: queue %r expired (x-expires)", self.name, queue.name)
            self.remove_queue(queue)
        return expired

    def persisted(self, destination: Destination) -> bool:
        """Whether `destination` exists and is recorded in the definitions journal."""
        if destination.kind == "queue":
            queue = self.queues.get(destination.name)
            return queue is not None and queue.persisted
        exchange = self.exchanges.get(destination.name)
        return exchange is not None and exchange.durable

    def exists(self, destination: Destination) -> bool:
        """Whether the queue or exchange `destination` names is declared."""
        if destination.kind == "queue":
            return destination.name in self.queues
        return destination.name in self.exchanges


def _unwired(queue: Queue, now_ms: int) -> int:
    raise AssertionError("the vhost wires this in before the first declare")
