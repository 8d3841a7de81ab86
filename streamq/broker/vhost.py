"""A virtual host: its exchanges, queues and bindings, and the routing of messages.

Owns the entity registry of one vhost, the shared message log of its classic queues
(each routed message is appended once, whatever the number of queues it goes to; the
queues hold offsets in it and read their messages back from it, `delivery.py`), and
the hand-over of ready messages to consumers. It is synchronous and single-threaded; the
gateway calls `drain` when the vhost asks for it through `wakeup`, so that deliveries are
batched per event-loop turn.

Durability: durable exchanges, durable non-exclusive queues and the bindings between
durable ends are recorded in the definitions journal; each such queue records its
messages in its own journal (`streamq.queues.journal`). Both are sync companions of the
log, so one fsync round covers messages, queue journals and definitions alike. Opening a
vhost restores all of it before it returns: nothing is served before that.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from streamq.broker.dead_letters import DeadLetters
from streamq.broker.deadletter import (
    EXPIRATION_FLAG_BYTE0,
    DeadLetterRun,
    PropertiesCodec,
    dead_letter_copy,
    may_expire,
)
from streamq.broker.dedup import deduper_for
from streamq.broker.definitions import (
    COMPACT_SLACK_RECORDS,
    DefinitionsJournal,
)
from streamq.broker.delivery import (
    MessageUnreadable,
    RunLength,
    read_message,
    read_queued,
    round_robin,
    unexpired_runs,
)
from streamq.broker.errors import (
    AccessRefused,
    NotFound,
    PreconditionFailed,
    QueueUnavailable,
    ResourceLocked,
)
from streamq.broker.exchange import Binding, Destination, Exchange, freeze_arguments
from streamq.broker.parameters import RuntimeParameters
from streamq.broker.policies import (
    Policy,
    choose,
    effective,
)
from streamq.broker.priority import PRIORITY_FLAG_BYTE0, message_priority
from streamq.broker.queue import Consumer, Queue, locked_text
from streamq.broker.queue_arguments import (
    STREAM,
    check_queue_arguments,
    check_queue_properties,
    with_default_queue_type,
)
from streamq.broker.stats import MessageStats
from streamq.broker.streams import (
    check_stream_arguments,
    delete_stream_files,
    drain_stream,
    open_stream,
    track,
)
from streamq.broker.vhost_policies import VHostPolicies
from streamq.broker.vhost_publish import VHostPublish
from streamq.broker.vhost_runs import VHostRuns
from streamq.broker.vhost_store import (
    PREDECLARED,
    VHostStore,
    binding_op,
    exchange_op,
    queue_op,
)
from streamq.log import files
from streamq.log.errors import LogError
from streamq.log.files import fsync_directory
from streamq.log.format import Record
from streamq.log.log import MIB, LogConfig, RunMessage, SegmentLog
from streamq.log.syncer import Syncer
from streamq.queues.classic import ReadyMessage
from streamq.queues.journal import QueueJournal

logger = logging.getLogger(__name__)

DRAIN_DELIVERIES_MAX: Final = 4096  # per queue per drain, so one queue cannot starve others
EXPIRE_RUN_MAX: Final = 4096  # expired messages read, dead-lettered and settled per run
# Publisher flow control: a classic queue whose consumers are all out of credit after a
# delivery round and whose ready backlog exceeds the high mark is "in flow" (publishers to
# it are held briefly) until the backlog falls below the low mark.
FLOW_READY_HIGH: Final = 10_000
FLOW_READY_LOW: Final = FLOW_READY_HIGH // 2
# The log of the vhost's classic-queue messages rolls every 64 MiB: each roll costs about
# a millisecond on the event loop and as much on the Syncer thread (a file created, an
# index written and fsynced, the directory fsynced), which at 8 MiB segments was 8 us of
# every 64 KiB publish (docs/perf.md, "Direct I/O segment writes"). The price: disk comes
# back in 64 MiB steps as queues move on. Its writes go to the disk 4 MiB at a time,
# which halved the Syncer's time per MiB against 1 MiB writes (one log per vhost: the
# larger buffer is not multiplied by the number of queues).
# The newest 32 MiB stay in memory after their write, so that consumers keeping up with
# publishers read from memory rather than from the disk past the page cache.
MESSAGE_LOG_CONFIG: Final = LogConfig(
    segment_bytes_max=64 * MIB,
    write_buffer_bytes_max=4 * MIB,
    writes_pending_bytes_max=16 * MIB,
    recent_bytes_max=32 * MIB,
)
ROUTE_DEPTH_MAX: Final = 64  # exchange-to-exchange hops followed for one message
DEFAULT_EXCHANGE_REFUSED: Final = "operation not permitted on the default exchange"
_DEFAULT_EXCHANGE: Final = Destination("exchange", "")


class VHost(VHostPolicies, VHostStore, VHostPublish, VHostRuns):
    def __init__(
        self, name: str, directory: str, syncer: Syncer, *, failover: bool = False
    ) -> None:
        """Open the vhost and restore its durable state (blocking: start-up only). With
        `failover` (a node promoted to cluster leader), every message restored into a
        classic queue comes back flagged redelivered (see `VHostStore._restore_cursor`).

        Raises LogError, DefinitionsCorrupted and OSError.
        """
        self.name = name
        self.directory = directory
        self.failover = failover
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self.log = SegmentLog.open(
            os.path.join(directory, "messages"), MESSAGE_LOG_CONFIG, syncer=syncer
        )
        self.dirty: set[Queue] = set()
        self.wakeup: Callable[[], None] = lambda: None
        self._syncer = syncer
        self._streams_dir = os.path.join(directory, "streams")
        self.streams_unsynced: set[Queue] = set()  # streams with appends not yet durable
        self._streams_syncing: set[Queue] = set()
        self._stream_count = 0
        # Followers of streams outside the AMQP gateway (stream_gateway): called with the
        # queue after each sync round of a stream (its appends became durable: confirms
        # and deliveries are due) and after a stream is removed.
        self.stream_synced_listeners: list[Callable[[Queue], None]] = []
        self.stream_removed_listeners: list[Callable[[Queue], None]] = []
        self._queues_dir = os.path.join(directory, "queues")
        self._queues_dir_dirty = False
        self._dirty_journals: set[QueueJournal] = set()
        # The gateway's reader and writer of AMQP properties, for TTL and dead letters.
        self.properties_codec: PropertiesCodec | None = None
        self.publish_rejected = False  # the last publish was refused by a full queue
        # The type of a new queue declared without `x-queue-type` (the broker sets it from
        # the vhost's metadata); None: classic.
        self.default_queue_type: str | None = None
        self.policies: dict[str, Policy] = {}
        self.operator_policies: dict[str, Policy] = {}
        # Shovels and federation upstreams, recorded in the definitions journal (a lambda:
        # the journal opens below, after this is in place for its replay).
        self.parameters = RuntimeParameters(name, lambda op: self.definitions.record(op))  # noqa: PLW0108
        # Message statistics (streamq.broker.stats): confirms and unroutable publishes,
        # exchanges' publishes by name, and the counts of deleted queues.
        self.stats = MessageStats()
        self.exchange_stats: dict[str, MessageStats] = {}
        self.retired_stats = MessageStats()
        # Followers of entity changes (federation: streamq.links). `binding_listeners` get
        # (source exchange, binding, added) after a binding is added or removed, deleted
        # ends included; `queue_listeners[name]` are called after a drain round of that
        # queue and when it loses a consumer (its demand may have changed).
        self.binding_listeners: list[Callable[[str, Binding, bool], None]] = []
        self.queue_listeners: dict[str, list[Callable[[Queue], None]]] = {}
        for exchange_name, exchange_type in PREDECLARED:
            self.exchanges[exchange_name] = Exchange(
                exchange_name, exchange_type, True, False, False, {}
            )
        files.makedirs(self._queues_dir)
        files.makedirs(self._streams_dir)
        fsync_directory(directory)
        self.definitions, ops = DefinitionsJournal.open(os.path.join(directory, "definitions"))
        for op in ops:
            self._apply(op)
        snapshot = self._snapshot()
        if len(ops) > len(snapshot) + COMPACT_SLACK_RECORDS:
            self.definitions.replace(snapshot)
        self.dead_letters = DeadLetters(self)  # held by at-least-once queues
        self._restore_queues()
        self._open_publish_extras()
        self.apply_policies()
        self.log.add_sync_companion(self._prepare_sync)

    def _drop_exchange(self, name: str) -> None:
        exchange = self.exchanges.pop(name, None)
        if exchange is not None:
            self._unbind_everywhere(Destination("exchange", name))

    def _unbind_everywhere(self, destination: Destination) -> list[Exchange]:
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
            self._drop_exchange(exchange.name)
            self.delayed.drop_exchange(exchange.name)
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
        exchange.policy = effective(
            choose(self.policies, "exchange", name, ""),
            choose(self.operator_policies, "exchange", name, ""),
        )
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
        self._drop_exchange(name)
        self.delayed.drop_exchange(name)
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
        if added and exchange.durable and self._persisted(destination):
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
        if exchange is None or not self._exists(destination):
            return  # RabbitMQ: unbinding what does not exist succeeds
        removed = exchange.unbind(destination, routing_key, arguments)
        if removed and exchange.durable and self._persisted(destination):
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
    ) -> Queue:
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
        arguments = with_default_queue_type(
            arguments, self.default_queue_type, durable, exclusive, auto_delete
        )
        kind = check_queue_arguments(name, self.name, arguments)
        if kind == STREAM:
            check_stream_arguments(name, self.name, arguments)
        check_queue_properties(kind, name, self.name, durable, exclusive, auto_delete)
        deduper = deduper_for(arguments)
        queue = Queue(name, durable, owner if exclusive else None, auto_delete, arguments)
        self._queue_dedup(queue, deduper)
        if kind == STREAM:
            queue.stream = open_stream(self._stream_dir(name), queue, self._syncer)
            self._stream_count += 1
        self.queues[name] = queue
        self._apply_policy(queue)
        if queue.persisted:
            self.definitions.record(queue_op(queue))
            if queue.stream is None:
                queue.attach_journal(
                    QueueJournal.create(self._journal_path(name), self._dirty_journals)
                )
                self._queues_dir_dirty = True
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
        self._queue_dedup(queue, None)
        self.dirty.discard(queue)
        queue.window.release()
        if queue.persisted:
            self.definitions.record({"op": "queue.delete", "name": queue.name})
        if queue.stream is not None:
            count = queue.stream.message_count
            queue.stream.log.discard()
            queue.stream.offsets.close()
            queue.stream.publishers.close()
            self._stream_count -= 1
        if queue.stream is not None or queue.arguments.get("x-queue-type") == STREAM:
            delete_stream_files(self._stream_dir(queue.name))  # also a failed stream's
            self.streams_unsynced.discard(queue)
            self._streams_syncing.discard(queue)
            for listener in tuple(self.stream_removed_listeners):
                listener(queue)
        journal = queue.cursor.journal
        if journal is not None:
            # The journal's removal is made durable by the directory fsync of the round
            # that writes the queue.delete record.
            queue.cursor.journal = None
            self._dirty_journals.discard(journal)
            journal.close()
            files.remove(journal.path)
            self._queues_dir_dirty = True
        for exchange in self._unbind_everywhere(Destination("queue", queue.name)):
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

    # -- messages --------------------------------------------------------------------------

    def route(
        self,
        exchange_name: str,
        routing_key: str,
        headers: Mapping[str, object] | None,
        properties: Mapping[str, object] | None = None,
        properties_raw: bytes | None = None,
    ) -> list[Queue]:
        """The queues a message goes to. Raises NotFound for a missing exchange.
        `properties` matter to consistent hash exchanges with `hash-property` only.
        A caller that has not decoded the message passes `properties_raw` instead: the
        headers and properties are decoded from it (once) if the route reaches an
        exchange that reads them, say a headers exchange bound to a direct one."""
        queues = self._route(exchange_name, routing_key, headers, properties, properties_raw)
        assert queues is not None  # only a run's route declines to read properties
        return queues

    def route_run(self, exchange_name: str, routing_key: str) -> list[Queue] | None:
        """`route` for a run of messages with this exchange and routing key: None when
        an exchange on the route reads properties (each message must route on its own)."""
        return self._route(exchange_name, routing_key, None, None, None, run=True)

    def _route(
        self,
        exchange_name: str,
        routing_key: str,
        headers: Mapping[str, object] | None,
        properties: Mapping[str, object] | None,
        properties_raw: bytes | None,
        *,
        run: bool = False,
    ) -> list[Queue] | None:
        if exchange_name == "":
            queue = self.queues.get(routing_key)
            return [queue] if queue is not None and queue.failed is None else []
        start = self.exchange(exchange_name)
        found: set[Destination] = set()
        seen = {exchange_name}
        pending = [start]
        depth = 0
        while pending and depth < ROUTE_DEPTH_MAX:
            exchange = pending.pop()
            depth += 1
            if exchange.reads_properties:
                if run:
                    return None
                if properties_raw:
                    headers, properties = self.decode_for_route(properties_raw)
                    properties_raw = None
            matched: set[Destination] = set()
            exchange.route(routing_key, headers, matched, properties)
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
        return [queues[d.name] for d in found if d.name in queues and queues[d.name].failed is None]

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
        if self._stream_count:
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
        dirty = self.dirty
        was_idle = not dirty
        expiring = bool(properties_raw) and bool(properties_raw[0] & EXPIRATION_FLAG_BYTE0)
        if expiring:
            for queue in queues:
                queue.holds_expiring = True
        # Only a message with a priority pays for reading it (priority queues use it).
        priority = (
            message_priority(properties_raw)
            if properties_raw and properties_raw[0] & PRIORITY_FLAG_BYTE0
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
                self._drain_queue(queue)
            if queue.overflow == "drop-head":
                self._drop_head(queue, timestamp_ms)  # its dead letters publish too
        self.publish_rejected = rejected
        if was_idle and dirty:
            self.wakeup()
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
                self._dead_letter_record(queue, record, "maxlen", timestamp_ms)
        self.publish_rejected = True  # after the dead letters, which publish themselves
        return [q for q in queues if q not in refused]

    def _drop_head(self, queue: Queue, now_ms: int) -> None:
        """drop-head: dead-letter (reason maxlen) from the head while over a limit."""
        while _over_limit(queue, 0, 0):
            taken = queue.cursor.take()
            if taken is None:
                return
            self.dead_letter_taken(queue, taken.offset, "maxlen", now_ms)

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
                self.stream_appended(queue)
        return offset

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

    def settle(self, queue: Queue, offset: int, consumer: Consumer | None = None) -> None:
        """The message left `queue` for good (acked, or rejected without requeue)."""
        if queue.stream is not None:
            # Reading a stream consumes nothing: the ack returned credit, and moves the
            # consumer's stored offset if it tracks one.
            if consumer is not None:
                track(queue.stream, consumer, offset)
            return
        if self.queues.get(queue.name) is not queue:
            return  # deleted meanwhile: nothing is held for it any more
        queue.cursor.ack(offset)

    def settle_classic(self, queue: Queue, offsets: list[int]) -> None:
        """`settle` of several messages of one classic queue (acks with `multiple`)."""
        if self.queues.get(queue.name) is not queue:
            return  # deleted meanwhile: nothing is held for it any more
        queue.cursor.ack_many(offsets)

    def requeue(self, queue: Queue, offset: int, consumer: Consumer | None = None) -> None:
        """Back to the queue; on a stream, back to the consumer that had it, if it is
        still there (nothing to do otherwise: the message stays in the stream). A
        drop-head length limit applies after it, as RabbitMQ applies it after a requeue."""
        self._requeue(queue, offset, consumer)
        self._drop_head_requeued(queue)

    def requeue_many(
        self, entries: Iterable[tuple[Queue, int, Consumer | None]], *, deliver: bool
    ) -> None:
        """`requeue` of a batch (a group of a nack, a reject or a recover, or what a
        closed channel held): every message back in its place first, then each queue's
        drop-head limit once, as RabbitMQ's requeue_and_run drops from the head after the
        whole batch (dropping per message would dead-letter in another order); with
        `deliver`, the queue then delivers at once, as requeue_and_run does, before the
        caller's next batch."""
        queues: dict[Queue, None] = {}
        for queue, offset, consumer in entries:
            self._requeue(queue, offset, consumer)
            queues[queue] = None
        for queue in queues:
            self._drop_head_requeued(queue)
            if deliver:
                self.deliver_now(queue)

    def deliver_now(self, queue: Queue) -> None:
        """Hand `queue`'s ready messages to its consumers with credit now, not at the end
        of the loop turn (where RabbitMQ's queue process delivers within one event)."""
        if queue.consumers and self.queues.get(queue.name) is queue:
            self._drain_queue(queue)

    def _drop_head_requeued(self, queue: Queue) -> None:
        if queue.stream is not None or queue.overflow != "drop-head":
            return
        limited = queue.max_length is not None or queue.max_length_bytes is not None
        if limited and self.queues.get(queue.name) is queue:
            self._drop_head(queue, int(time.time() * 1000))

    def _requeue(self, queue: Queue, offset: int, consumer: Consumer | None) -> None:
        if queue.stream is not None:
            if consumer is not None and consumer in queue.consumers:
                consumer.stream_redeliver.append(offset)
                queue.stats.redeliver += 1
                self.kick(queue)
            return
        if self.queues.get(queue.name) is not queue:
            return  # deleted meanwhile: nothing is held for it any more
        limit = queue.delivery_limit
        if limit is not None and queue.cursor.delivery_count(offset) > limit:
            # Requeued more often than x-delivery-limit allows (each delivery but this
            # one ended in a requeue): dead-lettered, or dropped without a DLX.
            self.dead_letter(queue, offset, "delivery_limit", int(time.time() * 1000))
            return
        queue.cursor.requeue(offset)
        queue.stats.redeliver += 1
        self.kick(queue)

    def kick(self, queue: Queue) -> None:
        """Ask for a drain of `queue` (it has new messages or its consumers new credit)."""
        if queue.consumers and (queue.stream is not None or queue.cursor.message_count):
            was_idle = not self.dirty
            self.dirty.add(queue)
            if was_idle:
                self.wakeup()

    def collect_segments(self) -> int:
        """Delete log segments that no queue needs any more; returns how many.

        A segment goes when every offset in it is below the lowest offset any queue still
        holds (ready or unacked). The deletion is durable after the next sync round.
        """
        now_ms = int(time.time() * 1000)
        for queue in self.queues.values():
            if queue.stream is not None:
                queue.stream.apply_retention(now_ms, force=True)  # max-age moves with time
        if any(
            q.failed is not None and q.arguments.get("x-queue-type") != STREAM
            for q in self.queues.values()
        ):
            return 0  # a failed classic queue's messages stay for inspection
        low = self.log.next_offset
        for queue in self.queues.values():
            needed = queue.cursor.low_water_offset()
            if needed is not None and needed < low:
                low = needed
        return self.log.drop_segments_before(low)

    async def sync(self) -> int:
        """Make every published message durable (group commit with all other callers),
        streams included."""
        # A delayed message touches no log record: wait for a round of the companions.
        durable = await self.log.sync(companions=self.delayed.unsynced)
        for queue in list(self.streams_unsynced):
            if queue.stream is not None:
                await queue.stream.log.sync()
        return durable

    # -- consumers -------------------------------------------------------------------------

    # -- TTL and dead letters ----------------------------------------------------------------

    def take(
        self, queue: Queue, now_ms: int, fresh_from: int | None = None
    ) -> tuple[ReadyMessage, Record] | None:
        """The next message of a classic queue for a consumer or basic.get, with its
        record, taken from the cursor (the caller marks it delivered); expired ones on
        the way are dead-lettered (or dropped), never delivered; so are those at the head
        once it is taken, as RabbitMQ's fetch drops them: basic.get-ok's message_count
        leaves them out. Raises MessageUnreadable.

        A delivery round passes `fresh_from` (`Queue.fresh_offset_min`): the messages
        from that offset on that were never delivered are its to offer and do not expire
        first, as RabbitMQ gives a message to a consumer with credit on arrival whatever
        its TTL (a requeued one expires, as RabbitMQ's requeue drops it). basic.get
        passes none: it never returns a message whose TTL has passed, not even one of 0."""
        while True:
            ready = queue.cursor.take()
            if ready is None:
                return None
            try:
                record = read_queued(self.log, queue, ready.offset)
            except MessageUnreadable:
                queue.cursor.untake(ready.offset)
                if queue.cursor.damage_noted():
                    continue  # lost to bit rot: the cursor drops it (log/damage.py)
                raise
            if fresh_from is not None and ready.offset >= fresh_from and not ready.redelivered:
                break
            if not self._expired(queue, record, now_ms):
                break
            if queue.at_least_once:
                self.dead_letters.hold(queue, ready.offset, "expired", now_ms, taken=record)
                continue
            self._dead_letter_record(queue, record, "expired", now_ms)
            queue.cursor.dropped(ready.offset, len(record.body))
        self._expire_head(
            queue, now_ms, self._fresh_from(queue) if fresh_from is None else fresh_from
        )
        return ready, record

    def get(self, queue: Queue, now_ms: int) -> tuple[ReadyMessage, Record] | None:
        """basic.get: `take`, and the message is in flight (settle or requeue it).
        Raises QueueUnavailable when the message cannot be read (the queue fails)."""
        try:
            taken = self.take(queue, now_ms)
        except MessageUnreadable as exc:
            self.fail_queue(queue, str(exc))
            raise QueueUnavailable(queue.name, self.name, str(exc)) from exc
        if taken is not None:
            ready, record = taken
            queue.cursor.delivered(ready.offset, len(record.body))
        return taken

    def _expired(self, queue: Queue, record: Record, now_ms: int) -> bool:
        ttl = queue.message_ttl_ms
        codec = self.properties_codec
        if codec is not None and may_expire(record.properties):
            own = codec.expiration_ms(record.properties)
            if own is not None:
                ttl = own if ttl is None else min(ttl, own)
        return ttl is not None and now_ms >= record.timestamp_ms + ttl and ttl >= 0

    def _expiry_check(
        self, queue: Queue, now_ms: int, fresh_from: int | None
    ) -> Callable[[int], Record | None]:
        """The record of the message at an offset of `queue` if it has expired at
        `now_ms`, else None; those from `fresh_from` on that were never delivered wait
        for their first delivery round and have not (see `take`). Reads the record
        (MessageUnreadable)."""
        log = self.log
        # Nothing in a queue is at the log's next offset or past it.
        fresh_min = log.next_offset if fresh_from is None else fresh_from
        delivered = queue.cursor.delivery_count  # looked up only from fresh_min on

        def expired(offset: int) -> Record | None:
            if offset >= fresh_min and delivered(offset) == 0:
                return None
            record = read_queued(log, queue, offset)
            return record if self._expired(queue, record, now_ms) else None

        return expired

    def _fresh_from(self, queue: Queue) -> int | None:
        """Where the messages of `queue` that wait for their first delivery round start,
        None if none wait: a round is due after each enqueue to a queue with consumers
        (the queue is dirty until the gateway's next drain, in the next loop turn)."""
        return queue.fresh_offset_min if queue in self.dirty else None

    def expire_heads(self, now_ms: int) -> int:
        """Dead-letter what has expired at the head of each queue, consumers or not (as
        RabbitMQ); returns how many. The housekeeping timer calls it."""
        return sum(self.expire_head(queue, now_ms) for queue in list(self.queues.values()))

    def expire_head(self, queue: Queue, now_ms: int) -> int:
        """Dead-letter what has expired at the head of `queue`; returns how many.
        RabbitMQ drops such messages when they expire (at once for a TTL of 0 unless a
        consumer takes it on arrival), so a declare-ok or get-ok never counts them: those
        call it, and housekeeping. Messages that wait for their first delivery round (see
        `take`) stay for it."""
        return self._expire_head(queue, now_ms, self._fresh_from(queue))

    def _expire_head(self, queue: Queue, now_ms: int, fresh_from: int | None) -> int:
        if queue.stream is not None or queue.failed is not None:
            return 0
        if queue.message_ttl_ms is None and not queue.holds_expiring:
            return 0
        expired_runs = 0
        if not queue.holds_expiring and queue.max_priority is None and not queue.at_least_once:
            try:
                expired_runs = self._expire_head_runs(queue, now_ms, fresh_from)
            except MessageUnreadable as exc:
                self.fail_queue(queue, str(exc))
                return 0
        run: list[DeadLetterRun | None] = [None]
        cursor = queue.cursor

        def dead_letter(offset: int, record: object) -> None:
            # Each expired message is read once and dead-lettered right away: a run of
            # them with the same exchange, routing key and properties (say, one
            # publisher's) shares one x-death splice and one route (`DeadLetterRun`).
            assert isinstance(record, Record)
            if queue.at_least_once:
                self.dead_letters.hold(queue, offset, "expired", now_ms, taken=record)
                return
            run[0] = self._dead_letter_record(queue, record, "expired", now_ms, run[0])
            cursor.dropped(offset, len(record.body))

        expired = self._expiry_check(queue, now_ms, fresh_from)
        if queue.at_least_once:
            expired = self.dead_letters.bounded(expired)  # the rest at the next tick
        try:
            taken = cursor.take_expired(expired, dead_letter)
        except MessageUnreadable as exc:
            self.fail_queue(queue, str(exc))
            return 0
        return expired_runs + len(taken)

    def _expire_head_runs(self, queue: Queue, now_ms: int, fresh_from: int | None) -> int:
        """`_expire_head` for a queue whose only TTL is its own, in runs: the expired
        messages at its head that were never delivered are read in order (timestamps
        never decrease along the log, so they end at the first one that has not
        expired), taken as one run, dead-lettered as runs of publishes and settled as
        one journal entry. What is left (requeued messages) takes the general path.
        Returns how many expired. Raises MessageUnreadable."""
        ttl = queue.message_ttl_ms
        if ttl is None or ttl < 0:
            return 0
        cursor = queue.cursor
        log = self.log
        fresh_min = log.next_offset if fresh_from is None else fresh_from
        published_max_ms = now_ms - ttl  # expired: published at or before this
        total = 0
        while True:
            first, count = cursor.fresh_head_run()
            count = min(count, fresh_min - first, EXPIRE_RUN_MAX)
            if count <= 0:
                return total
            records: list[Record] = []
            for offset in range(first, first + count):
                record = read_queued(log, queue, offset)
                if record.timestamp_ms > published_max_ms:
                    break
                records.append(record)
            if not records:
                return total
            taken, taken_count = cursor.take_run(len(records))
            assert (taken, taken_count) == (first, len(records))
            self._dead_letter_records(queue, records, "expired", now_ms)
            cursor.dropped_run(first, len(records), sum(len(r.body) for r in records))
            total += len(records)
            if len(records) < count:
                return total

    def _dead_letter_records(
        self, queue: Queue, records: list[Record], reason: str, now_ms: int
    ) -> None:
        """Dead-letter `records` of `queue`, in order: those that share exchange, routing
        key and properties with the one before share its x-death splice and route, and
        are published as one run (`publish_run`) where it takes them."""
        index = 0
        while index < len(records):
            head = records[index]
            run = self._dead_letter_record(queue, head, reason, now_ms)
            end = index + 1
            while end < len(records) and (
                records[end].properties == head.properties
                and records[end].exchange == head.exchange
                and records[end].routing_key == head.routing_key
            ):
                end += 1
            rest = records[index + 1 : end]
            if rest and run is not None and run.targets:
                exchange_name = queue.dead_letter_exchange or ""
                # A publish run's items as the gateway's scan gives them (what follows
                # properties and body is not read by `publish_run`).
                messages: list[RunMessage] = [
                    (run.properties, r.body, exchange_name, run.dead_routing_key, 0) for r in rest
                ]
                if not self.publish_run(
                    exchange_name, run.dead_routing_key, messages, run.targets, now_ms
                ):
                    for record in rest:  # a limit or a stream on the way: one by one
                        self._dead_letter_record(queue, record, reason, now_ms, run)
            index = end

    def expire_queues(self, now_s: float) -> list[Queue]:
        """Delete the queues unused for their x-expires (monotonic `now_s`); returns
        them. The housekeeping timer calls it; deletions are durable after a sync round."""
        expired = [q for q in self.queues.values() if q.expired(now_s)]
        for queue in expired:
            logger.info("vhost %s: queue %r expired (x-expires)", self.name, queue.name)
            self.remove_queue(queue)
        return expired

    def reject(self, queue: Queue, offset: int, consumer: Consumer | None = None) -> None:
        """A nack or reject without requeue: dead-lettered, or dropped without a DLX."""
        if queue.stream is not None:
            self.settle(queue, offset, consumer)
            return
        if self.queues.get(queue.name) is not queue:
            return  # deleted meanwhile: nothing to dead-letter from, nothing to release
        self.dead_letter(queue, offset, "rejected", int(time.time() * 1000))

    def dead_letter(self, queue: Queue, offset: int, reason: str, now_ms: int) -> None:
        """Move the message in flight at `offset` out of `queue`: republish it to the
        dead-letter exchange with its death recorded, or drop it (no DLX, a missing one,
        or a cycle); an at-least-once queue holds it until its targets have it."""
        if queue.at_least_once:
            self.dead_letters.hold(queue, offset, reason, now_ms)
            return
        if queue.dead_letter_exchange is not None:
            try:
                record = read_message(self.log, offset)
            except MessageUnreadable as exc:
                self.fail_queue(queue, str(exc))
                return
            self._dead_letter_record(queue, record, reason, now_ms)
        self.settle(queue, offset)

    def dead_letter_taken(self, queue: Queue, offset: int, reason: str, now_ms: int) -> None:
        """`dead_letter` of a message just taken from the cursor, not delivered."""
        try:
            record = read_queued(self.log, queue, offset)
        except MessageUnreadable as exc:
            queue.cursor.untake(offset)
            self.fail_queue(queue, str(exc))
            return
        self._dead_letter_record(queue, record, reason, now_ms)
        queue.cursor.dropped(offset, len(record.body))

    def _dead_letter_record(
        self,
        queue: Queue,
        record: Record,
        reason: str,
        now_ms: int,
        run: DeadLetterRun | None = None,
    ) -> DeadLetterRun | None:
        """Republish `record` as a dead letter of `queue`; returns what a following
        message of the same run can reuse (see `_expire_head`)."""
        exchange_name = queue.dead_letter_exchange
        codec = self.properties_codec
        if exchange_name is None or codec is None or exchange_name not in self.exchanges:
            return None
        body = record.body
        properties_raw = record.properties
        exchange = record.exchange.decode("utf-8", "surrogateescape")
        routing_key = record.routing_key.decode("utf-8", "surrogateescape")
        if (
            run is not None
            and run.properties_raw == properties_raw
            and run.exchange == exchange
            and run.routing_key == routing_key
        ):
            self.publish(
                exchange_name,
                run.dead_routing_key,
                run.properties,
                body,
                run.targets,
                now_ms,
            )
            return run
        copy = dead_letter_copy(
            codec, queue, record, reason, now_ms // 1000, self.dead_letter_route(exchange_name)
        )
        self.publish(exchange_name, copy.routing_key, copy.properties, body, copy.targets, now_ms)
        return DeadLetterRun(
            properties_raw, exchange, routing_key, copy.routing_key, copy.properties, copy.targets
        )

    def dead_letter_route(self, exchange_name: str) -> Callable[[str, bytes], list[Queue]]:
        """Routing on a dead-letter exchange by routing key and properties."""
        return lambda key, properties: self.route(
            exchange_name, key, None, properties_raw=properties
        )

    def fail_queue(self, queue: Queue, reason: str) -> None:
        """The queue's data cannot be read: it refuses everything but deletion from now
        on, its consumers are cancelled, and the rest of the broker goes on."""
        if queue.cursor.damage_noted():  # records lost to bit rot: dropped, not a failure
            self.kick(queue)
            return
        logger.error("vhost %s: queue %r failed: %s", self.name, queue.name, reason)
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

    def add_consumer(self, queue: Queue, consumer: Consumer) -> None:
        if any(c.exclusive for c in queue.consumers):
            raise AccessRefused(f"queue '{queue.name}' in vhost '{self.name}' in exclusive use")
        if consumer.exclusive and queue.consumers:
            raise AccessRefused(f"queue '{queue.name}' in vhost '{self.name}' in exclusive use")
        if not queue.consumers:
            # What came while nobody consumed was not offered on arrival: its TTL counts.
            queue.fresh_offset_min = self.log.next_offset
        queue.consumers.append(consumer)
        queue.turns.append(consumer)
        queue.had_consumers = True
        self.kick(queue)
        self._queue_changed(queue)

    def remove_consumer(self, queue: Queue, consumer: Consumer) -> None:
        if consumer in queue.consumers:
            queue.consumers.remove(consumer)
            if consumer in queue.turns:
                queue.turns.remove(consumer)
            elif consumer in queue.parked:
                queue.parked.remove(consumer)
            queue.last_used_s = time.monotonic()  # the x-expires lease starts again
        if not queue.consumers:
            queue.in_flow = False
        if queue.auto_delete and not queue.consumers and queue.name in self.queues:
            self.remove_queue(queue)
        self._queue_changed(queue)

    def _queue_changed(self, queue: Queue) -> None:
        for listener in tuple(self.queue_listeners.get(queue.name, ())):
            listener(queue)

    def drain(self) -> None:
        """Hand ready messages to consumers with credit, round robin per queue."""
        dirty = self.dirty
        self.dirty = set()
        for queue in dirty:
            self._drain_queue(queue)
            if self.queue_listeners:
                self._queue_changed(queue)

    def _drain_queue(self, queue: Queue) -> None:
        if queue.stream is not None:
            try:
                if drain_stream(queue, queue.stream):
                    self.kick(queue)
            except LogError as exc:
                self.fail_queue(queue, f"its log failed: {exc}")
            return
        consumers = queue.consumers
        if not consumers:
            queue.in_flow = False
            queue.window.release()
            return
        take: Callable[[], tuple[ReadyMessage, Record] | None] | None = None
        runs_from: RunLength | None = None
        # With TTLs, the round offers what came since the last complete one (see `take`),
        # up to the log's end now; a round is complete when it empties the queue or
        # leaves every consumer out of credit.
        offered_end = None
        if queue.message_ttl_ms is not None or queue.holds_expiring:
            now_ms = int(time.time() * 1000)
            fresh_from, offered_end = queue.fresh_offset_min, self.log.next_offset

            def take() -> tuple[ReadyMessage, Record] | None:
                return self.take(queue, now_ms, fresh_from)

            runs_from = unexpired_runs(
                self.log, queue, fresh_from, lambda record: self._expired(queue, record, now_ms)
            )

        if queue.single_active:
            groups = [consumers[:1]]  # the first consumer to subscribe, until it leaves
        elif any(c.priority for c in consumers):
            groups = priority_groups(consumers)  # x-priority: higher ones first
        else:
            groups = [consumers]
        budget = DRAIN_DELIVERIES_MAX
        for group in groups:
            try:
                budget, empty = round_robin(self.log, queue, group, take, budget, runs_from)
            except MessageUnreadable as exc:
                self.fail_queue(queue, str(exc))
                return
            if empty:
                queue.in_flow = False
                queue.window.release()
                if offered_end is not None:
                    queue.fresh_offset_min = offered_end
                return
            if budget <= 0:  # the next round offers the rest
                self.kick(queue)
                if queue.in_flow and queue.cursor.message_count < FLOW_READY_LOW:
                    queue.in_flow = False
                return
        if offered_end is not None:
            # What the consumers, all out of credit now, could not take had its chance: a
            # TTL of 0 at the head expires at once, as in RabbitMQ on arrival.
            queue.fresh_offset_min = offered_end
            self._expire_head(queue, now_ms, offered_end)
        # Every consumer is out of credit: flow control (one comparison per round).
        ready = queue.cursor.message_count
        if ready > FLOW_READY_HIGH:
            queue.in_flow = True
        elif ready < FLOW_READY_LOW:
            queue.in_flow = False

    async def aclose(self) -> None:
        """Write and fsync everything buffered (after any round in flight), then close."""
        try:
            await self.log.close()
            for queue in self.queues.values():
                if queue.stream is not None:
                    await queue.stream.log.close()
        finally:
            self._close_journals()

    def close(self) -> None:
        """Write and fsync everything buffered, then close (blocking: shutdown only)."""
        try:
            self.log.close_blocking()
            for queue in self.queues.values():
                if queue.stream is not None:
                    queue.stream.log.close_blocking()
        finally:
            self._close_journals()

    def _close_journals(self) -> None:
        self.definitions.close()
        self.delayed.close()
        for queue in self.queues.values():
            if queue.stream is not None:
                queue.stream.offsets.close()
                queue.stream.publishers.close()
            if queue.cursor.journal is not None:
                queue.cursor.journal.close()


def _over_limit(queue: Queue, messages: int, size: int) -> bool:
    """Whether the queue would exceed a length limit with `messages` more ready messages
    of `size` bytes more (the dead letters it holds count, as in RabbitMQ)."""
    return queue.over_limit(messages, size)


def priority_groups(consumers: list[Consumer]) -> list[list[Consumer]]:
    """Consumers grouped by `x-priority`, highest first, each group in subscription order:
    a lower group gets messages only while every higher one is out of credit."""
    groups: dict[int, list[Consumer]] = {}
    for consumer in consumers:
        groups.setdefault(consumer.priority, []).append(consumer)
    return [groups[p] for p in sorted(groups, reverse=True)]
