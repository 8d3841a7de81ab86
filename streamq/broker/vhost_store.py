"""A vhost's durable state: replaying and snapshotting its definitions, and restoring
its queues (as cursors over the log, from their journals) and streams at start-up.

Owns the part of `VHost` that reads and writes the vhost directory beside the message
log: the definitions journal's records (as changes, applied without side effects), the
queue journals and stream logs of durable queues, the files of deleted ones, and the sync
companion that hands them to the log's fsync rounds. `VHost` mixes it in; it holds no
state of its own.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Final

from streamq.broker.dead_letters import DeadLetters
from streamq.broker.deadletter import may_expire
from streamq.broker.definitions import (
    DefinitionsCorrupted,
    DefinitionsJournal,
    Op,
    arguments_from_json,
    arguments_to_json,
)
from streamq.broker.delayed import DelayedStore
from streamq.broker.errors import BrokerError
from streamq.broker.exchange import Destination, Exchange
from streamq.broker.parameters import RuntimeParameters
from streamq.broker.policies import Policy, PolicyInvalid, policy_from_op, policy_op
from streamq.broker.priority import message_priority
from streamq.broker.queue import Queue
from streamq.broker.queue_arguments import STREAM
from streamq.broker.streams import OFFSETS_SUFFIX, delete_stream_files, open_stream
from streamq.log import files
from streamq.log.errors import LogError
from streamq.log.files import fsync_directory
from streamq.log.format import Record
from streamq.log.log import CompanionWork, SegmentLog
from streamq.log.syncer import Syncer
from streamq.queues.journal import JournalCorrupted, QueueJournal, Replay
from streamq.queues.offsets import OffsetsCorrupted

logger = logging.getLogger(__name__)

PREDECLARED: Final = (
    ("", "direct"),
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)
PREDECLARED_NAMES: Final = frozenset(name for name, _ in PREDECLARED)
RESTORE_READ_RECORDS: Final = 1024  # records read from the log per call while restoring
JOURNAL_SUFFIX: Final = ".journal"


class VHostStore:
    """Mixed into `VHost`; the attributes below are the vhost's."""

    name: str
    directory: str
    failover: bool  # restored classic-queue messages come back redelivered
    exchanges: dict[str, Exchange]
    queues: dict[str, Queue]
    log: SegmentLog
    definitions: DefinitionsJournal
    _syncer: Syncer
    _streams_dir: str
    _queues_dir: str
    _queues_dir_dirty: bool
    _dirty_journals: set[QueueJournal]
    _stream_count: int
    delayed: DelayedStore
    policies: dict[str, Policy]
    operator_policies: dict[str, Policy]
    parameters: RuntimeParameters
    dead_letters: DeadLetters

    def _drop_exchange(self, name: str) -> None:
        raise NotImplementedError  # VHost's

    def _unbind_everywhere(self, destination: Destination) -> list[Exchange]:
        raise NotImplementedError  # VHost's

    def _policy_table(self, operator: bool) -> dict[str, Policy]:
        # VHostPolicies', which comes first in VHost's bases.
        raise NotImplementedError

    def _apply(self, op: Op) -> None:
        """Replay one definitions record: a change, applied without side effects."""
        kind = op["op"]
        name = str(op.get("name", ""))
        if kind == "exchange":
            try:
                exchange = Exchange(
                    name,
                    str(op["type"]),
                    True,
                    bool(op.get("auto_delete")),
                    bool(op.get("internal")),
                    arguments_from_json(op.get("arguments")),
                )
                exchange.user = str(op.get("user", ""))  # absent from older journals
                self.exchanges[name] = exchange
            except BrokerError as exc:
                logger.error("vhost %s: cannot restore exchange %r: %s", self.name, name, exc)
        elif kind == "exchange.delete":
            self._drop_exchange(name)
        elif kind == "queue":
            self.queues[name] = Queue(
                name,
                True,
                None,
                bool(op.get("auto_delete")),
                arguments_from_json(op.get("arguments")),
            )
        elif kind == "queue.delete":
            if self.queues.pop(name, None) is not None:
                self._unbind_everywhere(Destination("queue", name))
        elif kind in ("policy", "operator_policy"):
            try:
                policy = policy_from_op(op)
            except PolicyInvalid as exc:
                logger.error("vhost %s: policy %r not restored: %s", self.name, name, exc)
                return
            self._policy_table(kind == "operator_policy")[name] = policy
        elif kind in ("policy.delete", "operator_policy.delete"):
            self._policy_table(kind == "operator_policy.delete").pop(name, None)
        elif kind in ("parameter", "parameter.delete"):
            self.parameters.restore(op)
        elif kind in ("bind", "unbind"):
            source = self.exchanges.get(str(op.get("source")))
            destination = Destination(str(op.get("kind")), str(op.get("destination")))
            if source is None or not self._exists(destination):
                return
            arguments = arguments_from_json(op.get("arguments"))
            if kind == "bind":
                source.bind(destination, str(op.get("routing_key")), arguments)
            else:
                source.unbind(destination, str(op.get("routing_key")), arguments)
        else:
            raise DefinitionsCorrupted(self.definitions.path, 0, f"unknown op {kind!r}")

    def _snapshot(self) -> list[Op]:
        """The definitions records that recreate every durable entity as it is now."""
        ops: list[Op] = [
            exchange_op(e)
            for e in self.exchanges.values()
            if e.durable and e.name not in PREDECLARED_NAMES
        ]
        ops += [queue_op(q) for q in self.queues.values() if q.persisted]
        for exchange in self.exchanges.values():
            if exchange.durable:
                ops += [
                    binding_op(
                        "bind", exchange.name, b.destination, b.routing_key, dict(b.arguments)
                    )
                    for b in exchange.bindings_in_order()
                    if self._persisted(b.destination)
                ]
        ops += [policy_op(p, operator=False) for p in self.policies.values()]
        ops += [policy_op(p, operator=True) for p in self.operator_policies.values()]
        ops += self.parameters.ops()
        return ops

    def _persisted(self, destination: Destination) -> bool:
        if destination.kind == "queue":
            queue = self.queues.get(destination.name)
            return queue is not None and queue.persisted
        exchange = self.exchanges.get(destination.name)
        return exchange is not None and exchange.durable

    def _exists(self, destination: Destination) -> bool:
        if destination.kind == "queue":
            return destination.name in self.queues
        return destination.name in self.exchanges

    def _journal_path(self, queue_name: str) -> str:
        digest = hashlib.sha1(queue_name.encode("utf-8", "surrogateescape")).hexdigest()
        return os.path.join(self._queues_dir, digest + JOURNAL_SUFFIX)

    def _restore_queues(self) -> None:
        """Open every durable queue's journal, drop files of queues that are gone, and load
        the messages the queues hold from the log."""
        self._restore_streams()
        wanted = {self._journal_path(q.name): q for q in self.queues.values() if q.stream is None}
        for entry in os.listdir(self._queues_dir):
            path = os.path.join(self._queues_dir, entry)
            if path not in wanted:
                files.remove(path)  # a deleted queue's journal, or a compaction's temp file
                self._queues_dir_dirty = True
        held: dict[Queue, tuple[QueueJournal, Replay]] = {}
        start, end = self.log.start_offset, self.log.next_offset
        for path, queue in wanted.items():
            if os.path.exists(path):
                try:
                    journal, replayed = QueueJournal.load(path, start, end, self._dirty_journals)
                except (JournalCorrupted, OSError) as exc:  # OSError: EIO reading it
                    # The queue stays declared but empty; its file is kept for operators.
                    logger.error("vhost %s: queue %r not restored: %s", self.name, queue.name, exc)
                    queue.failed = str(exc)
                    continue
                held[queue] = (journal, replayed)
            else:
                journal = QueueJournal.create(path, self._dirty_journals)
                self._queues_dir_dirty = True
            queue.attach_journal(journal)
        if self._queues_dir_dirty:
            fsync_directory(self._queues_dir)
            self._queues_dir_dirty = False
        restored = 0
        for queue, (journal, replayed) in held.items():
            try:
                self._restore_cursor(queue, journal, replayed)
                if replayed.dead:
                    self.dead_letters.restore(queue, replayed.dead)
            except (LogError, OSError) as exc:
                logger.error("vhost %s: queue %r failed: %s", self.name, queue.name, exc)
                queue.failed = f"its messages cannot be read: {exc}"
                continue
            restored += replayed.message_count
        if restored:
            logger.info(
                "vhost %s: restored %d messages in %d queues", self.name, restored, len(held)
            )

    def _restore_cursor(self, queue: Queue, journal: QueueJournal, replayed: Replay) -> None:
        """Give the queue what its journal holds. A plain queue takes the runs as they
        are: nothing is read from the log, so a restart costs O(runs), not O(messages).
        A priority queue reads each message's priority, and a journal whose byte total
        is inexact (entries discarded after a crash, or the older format) has it counted
        from the log and is rewritten."""
        cursor = queue.cursor
        queue.holds_expiring = replayed.expiring
        # After a failover every restored message counts as delivered once: plain queues
        # hold that as one offset (`redelivered_below`), priority queues per message.
        redelivered_below = replayed.runs[-1][0] + replayed.runs[-1][1] if replayed.runs else 0
        if not self.failover:
            redelivered_below = 0
        elif queue.max_priority is not None:
            replayed = replayed._replace(counts=delivered_at_least_once(replayed))
        size_bytes = replayed.size_bytes
        if queue.max_priority is None and replayed.size_exact:
            cursor.restore_runs(replayed.runs, replayed.counts, redelivered_below)
            cursor.bytes_ready = size_bytes
            return
        size_bytes = 0
        expiring = False
        priorities = queue.max_priority is not None
        for first, count in replayed.runs:
            for record in self._records(first, count):
                size_bytes += len(record.body)
                expiring = expiring or may_expire(record.properties)
                if priorities:
                    priority = message_priority(record.properties)
                    cursor.restore(record.offset, replayed.counts.get(record.offset, 0), priority)
        if not priorities:
            cursor.restore_runs(replayed.runs, replayed.counts, redelivered_below)
        cursor.bytes_ready = size_bytes
        queue.holds_expiring = expiring
        if not replayed.size_exact:
            journal.rewrite(replayed, size_bytes, expiring)

    def _records(self, first: int, count: int) -> Iterator[Record]:
        """The records of offsets `first` .. `first + count - 1` (start-up only), less
        those lost to damage on disk (the log's reads pass over them)."""
        offset, end = first, first + count
        while offset < end:
            records = self.log.read(offset, min(RESTORE_READ_RECORDS, end - offset))
            if not records:
                raise LogError(f"records from offset {offset} on are missing")
            yield from (record for record in records if record.offset < end)
            offset = records[-1].offset + 1

    def _stream_dir(self, queue_name: str) -> str:
        digest = hashlib.sha1(queue_name.encode("utf-8", "surrogateescape")).hexdigest()
        return os.path.join(self._streams_dir, digest)

    def _restore_streams(self) -> None:
        """Open every stream's log (recovering it); remove logs of deleted streams."""
        wanted: dict[str, Queue] = {}
        for queue in self.queues.values():
            if queue.arguments.get("x-queue-type") == STREAM:
                wanted[self._stream_dir(queue.name)] = queue
        for entry in os.listdir(self._streams_dir):
            path = os.path.join(self._streams_dir, entry).removesuffix(".tmp")
            path = path.removesuffix(OFFSETS_SUFFIX)
            if path not in wanted:
                delete_stream_files(path)
        for path, queue in wanted.items():
            try:
                queue.stream = open_stream(path, queue, self._syncer)
            except (LogError, OffsetsCorrupted, OSError) as exc:
                # Only this stream fails: it refuses all but deletion; its files stay.
                logger.error("vhost %s: stream %r not restored: %s", self.name, queue.name, exc)
                queue.failed = str(exc)
                continue
            self._stream_count += 1

    def _prepare_sync(self) -> CompanionWork:
        """The log's sync companion: hand the round every journal with new entries."""
        fds: list[int] = []
        writes: list[tuple[int, bytes]] = []
        actions: list[Callable[[], None]] = []
        if self.definitions.dirty:
            fds.append(self.definitions.prepare_sync())
        journals = self._dirty_journals
        while journals:
            fd, action, data = journals.pop().prepare_sync()
            if fd is not None:
                if data:
                    writes.append((fd, data))  # the Syncer writes it, then syncs fd
                else:
                    fds.append(fd)
            if action is not None:
                actions.append(action)
        if self._queues_dir_dirty:
            self._queues_dir_dirty = False
            queues_dir = self._queues_dir
            actions.append(lambda: fsync_directory(queues_dir))
        return CompanionWork(fds, actions, writes)

    def needs_sync(self) -> bool:
        """Whether definitions or queue journals hold changes not yet written."""
        return (
            self.definitions.dirty
            or bool(self._dirty_journals)
            or self._queues_dir_dirty
            or self.delayed.dirty
        )

    async def sync_all(self) -> None:
        """Make every change so far durable: messages, queue journals, definitions."""
        await self.log.sync(companions=True)


def exchange_op(exchange: Exchange) -> Op:
    return {
        "op": "exchange",
        "name": exchange.name,
        "type": exchange.type,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": arguments_to_json(exchange.arguments),
        "user": exchange.user,
    }


def queue_op(queue: Queue) -> Op:
    return {
        "op": "queue",
        "name": queue.name,
        "auto_delete": queue.auto_delete,
        "arguments": arguments_to_json(queue.arguments),
    }


def binding_op(
    op: str,
    source: str,
    destination: Destination,
    routing_key: str,
    arguments: Mapping[str, object],
) -> Op:
    return {
        "op": op,
        "source": source,
        "kind": destination.kind,
        "destination": destination.name,
        "routing_key": routing_key,
        "arguments": arguments_to_json(arguments),
    }


def delivered_at_least_once(replayed: Replay) -> dict[int, int]:
    """Delivery counts for a failover: every held offset counts one delivery at least.
    The former leader may have delivered any of them in its last moments (its deliver
    entries reach the journal with the next round, which the followers never got), so
    every one comes back redelivered, as RabbitMQ's quorum queues return the messages a
    lost leader had handed out. Priority queues only (they read every message at start-up
    anyway); plain queues hold one offset instead (`ClassicQueue.restore_runs`)."""
    counts = replayed.counts
    return {
        offset: max(counts.get(offset, 0), 1)
        for first, count in replayed.runs
        for offset in range(first, first + count)
    }
