"""A vhost's durable state on disk: its message log, definitions journal, queue journals
and stream directories, their sync rounds, and restoring queues from them at start-up.

Owns the vhost directory: the shared segment log of its classic queues (`messages/`),
the definitions journal (`definitions`, whose records other components make and replay:
`exchange_op`, `queue_op`, `binding_op` below), one journal per durable classic queue
(`queues/`, restored into the queues' cursors at start-up, created and removed with the
queues), the directories of stream logs (`streams/`), and the log's sync companion that
hands every journal with new entries to the log's fsync rounds (one fsync round covers
messages, queue journals and definitions alike). It is the lowest component but one
(see docs/architecture.md, "The vhost's components"): it is given the queues it works on
and imports no other component of the vhost.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final

from streamq.broker.deadletter import may_expire
from streamq.broker.definitions import (
    DefinitionsJournal,
    Op,
    arguments_to_json,
)
from streamq.broker.exchange import Destination, Exchange
from streamq.broker.expiration import EXPIRY_UNKNOWN
from streamq.broker.priority import message_priority
from streamq.broker.queue import Queue
from streamq.broker.queue_arguments import STREAM
from streamq.broker.streams import OFFSETS_SUFFIX, delete_stream_files, open_stream
from streamq.log import files
from streamq.log.errors import LogError
from streamq.log.files import fsync_directory
from streamq.log.format import Record
from streamq.log.log import MIB, CompanionWork, LogConfig, SegmentLog
from streamq.log.syncer import Syncer
from streamq.log_fields import EXCEPTION, QUEUE, VHOST
from streamq.progress import Progress
from streamq.queues.journal import JournalCorrupted, QueueJournal, Replay
from streamq.queues.offsets import OffsetsCorrupted
from streamq.queues.stream import StreamQueue

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


class Storage:
    """The files of one vhost: message log, definitions and queue journals, streams."""

    __slots__ = (
        "_dirty_journals",
        "_queues_dir",
        "_queues_dir_dirty",
        "_streams_dir",
        "_syncer",
        "definitions",
        "directory",
        "failover",
        "log",
        "name",
    )

    def __init__(self, name: str, directory: str, syncer: Syncer, *, failover: bool) -> None:
        """Open the message log and make the vhost's directories (blocking: start-up
        only); `open_definitions` follows. With `failover` (a node promoted to cluster
        leader), every message restored into a classic queue comes back flagged
        redelivered (see `_restore_cursor`). Raises LogError and OSError."""
        self.name = name
        self.directory = directory
        self.failover = failover
        self._syncer = syncer
        self.log = SegmentLog.open(
            os.path.join(directory, "messages"), MESSAGE_LOG_CONFIG, syncer=syncer
        )
        self._streams_dir = os.path.join(directory, "streams")
        self._queues_dir = os.path.join(directory, "queues")
        self._queues_dir_dirty = False
        self._dirty_journals: set[QueueJournal] = set()
        files.makedirs(self._queues_dir)
        files.makedirs(self._streams_dir)
        fsync_directory(directory)

    def open_definitions(self) -> list[Op]:
        """Open the definitions journal; returns its records, for the components to
        replay (start-up only). Raises DefinitionsCorrupted and OSError."""
        self.definitions, ops = DefinitionsJournal.open(os.path.join(self.directory, "definitions"))
        return ops

    def create_journal(self, queue_name: str) -> QueueJournal:
        """A new, empty journal for a durable classic queue (its file's creation is
        durable after the next sync round, which fsyncs the directory)."""
        self._queues_dir_dirty = True
        return QueueJournal.create(self._journal_path(queue_name), self._dirty_journals)

    def remove_journal(self, queue: Queue) -> None:
        """Close and remove the journal of a queue being deleted, if it has one."""
        journal = queue.cursor.journal
        if journal is not None:
            # The journal's removal is made durable by the directory fsync of the round
            # that writes the queue.delete record.
            queue.cursor.journal = None
            self._dirty_journals.discard(journal)
            journal.close()
            files.remove(journal.path)
            self._queues_dir_dirty = True

    def open_stream(self, queue: Queue) -> StreamQueue:
        """Create or open the log of stream `queue` (blocking). Raises LogError."""
        return open_stream(self._stream_dir(queue.name), queue, self._syncer)

    def delete_stream_files(self, queue: Queue) -> None:
        """Remove a deleted stream's files (also a failed stream's)."""
        delete_stream_files(self._stream_dir(queue.name))

    def collect_segments(self, queues: Iterable[Queue]) -> int:
        """Delete log segments that none of `queues` (all the vhost's) needs any more;
        returns how many.

        A segment goes when every offset in it is below the lowest offset any queue still
        holds (ready or unacked). The deletion is durable after the next sync round.
        """
        queues = list(queues)
        now_ms = int(time.time() * 1000)
        for queue in queues:
            if queue.stream is not None:
                queue.stream.apply_retention(now_ms, force=True)  # max-age moves with time
        if any(q.failed is not None and q.arguments.get("x-queue-type") != STREAM for q in queues):
            return 0  # a failed classic queue's messages stay for inspection
        low = self.log.next_offset
        for queue in queues:
            needed = queue.cursor.low_water_offset()
            if needed is not None and needed < low:
                low = needed
        return self.log.drop_segments_before(low)

    def _journal_path(self, queue_name: str) -> str:
        digest = hashlib.sha1(queue_name.encode("utf-8", "surrogateescape")).hexdigest()
        return os.path.join(self._queues_dir, digest + JOURNAL_SUFFIX)

    def restore_queues(
        self,
        queues: Iterable[Queue],
        restore_dead: Callable[[Queue, Mapping[int, int]], None],
    ) -> int:
        """Open every durable queue's journal, drop files of queues that are gone, and load
        the messages the queues hold from the log; `restore_dead` takes the dead letters
        a queue's journal says it holds (it raises LogError when one cannot be read).
        Returns how many streams were opened (start-up only)."""
        queues = list(queues)
        streams = self._restore_streams(queues)
        wanted = {self._journal_path(q.name): q for q in queues if q.stream is None}
        for entry in os.listdir(self._queues_dir):
            path = os.path.join(self._queues_dir, entry)
            if path not in wanted:
                files.remove(path)  # a deleted queue's journal, or a compaction's temp file
                self._queues_dir_dirty = True
        held: dict[Queue, tuple[QueueJournal, Replay]] = {}
        start, end = self.log.start_offset, self.log.next_offset
        progress = Progress(
            logger,
            f"vhost {self.name}: loading queue journals",
            len(wanted),
            "queues",
            fields={VHOST: self.name},
        )
        for path, queue in wanted.items():
            if os.path.exists(path):
                try:
                    journal, replayed = QueueJournal.load(path, start, end, self._dirty_journals)
                except (JournalCorrupted, OSError) as exc:  # OSError: EIO reading it
                    # The queue stays declared but empty; its file is kept for operators.
                    logger.error(
                        "vhost %s: queue %r not restored: %s",
                        self.name,
                        queue.name,
                        exc,
                        extra={VHOST: self.name, QUEUE: queue.name, EXCEPTION: exc},
                    )
                    queue.failed = str(exc)
                    progress.step()
                    continue
                held[queue] = (journal, replayed)
            else:
                journal = QueueJournal.create(path, self._dirty_journals)
                self._queues_dir_dirty = True
            queue.attach_journal(journal)
            progress.step()
        progress.finish()
        if self._queues_dir_dirty:
            fsync_directory(self._queues_dir)
            self._queues_dir_dirty = False
        restored = 0
        for queue, (journal, replayed) in held.items():
            try:
                self._restore_cursor(queue, journal, replayed)
                if replayed.dead:
                    restore_dead(queue, replayed.dead)
            except (LogError, OSError) as exc:
                logger.error(
                    "vhost %s: queue %r failed: %s",
                    self.name,
                    queue.name,
                    exc,
                    extra={VHOST: self.name, QUEUE: queue.name, EXCEPTION: exc},
                )
                queue.failed = f"its messages cannot be read: {exc}"
                continue
            restored += replayed.message_count
        if restored:
            logger.info(
                "vhost %s: restored %d messages in %d queues",
                self.name,
                restored,
                len(held),
                extra={VHOST: self.name},
            )
        return streams

    def _restore_cursor(self, queue: Queue, journal: QueueJournal, replayed: Replay) -> None:
        """Give the queue what its journal holds. A plain queue takes the runs as they
        are: nothing is read from the log, so a restart costs O(runs), not O(messages).
        A priority queue reads each message's priority, and a journal whose byte total
        is inexact (entries discarded after a crash, or the older format) has it counted
        from the log and is rewritten."""
        cursor = queue.cursor
        queue.holds_expiring = replayed.expiring
        if replayed.runs:  # their own expirations were not read: runs are checked
            queue.own_expiry_min_ms = EXPIRY_UNKNOWN
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

    def _restore_streams(self, queues: list[Queue]) -> int:
        """Open every stream's log (recovering it); remove logs of deleted streams.
        Returns how many were opened."""
        opened = 0
        wanted: dict[str, Queue] = {}
        for queue in queues:
            if queue.arguments.get("x-queue-type") == STREAM:
                wanted[self._stream_dir(queue.name)] = queue
        for entry in os.listdir(self._streams_dir):
            path = os.path.join(self._streams_dir, entry).removesuffix(".tmp")
            path = path.removesuffix(OFFSETS_SUFFIX)
            if path not in wanted:
                delete_stream_files(path)
        progress = Progress(
            logger,
            f"vhost {self.name}: opening streams",
            len(wanted),
            "streams",
            fields={VHOST: self.name},
        )
        for path, queue in wanted.items():
            try:
                queue.stream = open_stream(path, queue, self._syncer)
            except (LogError, OffsetsCorrupted, OSError) as exc:
                # Only this stream fails: it refuses all but deletion; its files stay.
                logger.error(
                    "vhost %s: stream %r not restored: %s",
                    self.name,
                    queue.name,
                    exc,
                    extra={VHOST: self.name, QUEUE: queue.name, EXCEPTION: exc},
                )
                queue.failed = str(exc)
                progress.step()
                continue
            opened += 1
            progress.step()
        progress.finish()
        return opened

    def prepare_sync(self) -> CompanionWork:
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
        return self.definitions.dirty or bool(self._dirty_journals) or self._queues_dir_dirty

    async def sync_all(self) -> None:
        """Make every change so far durable: messages, queue journals, definitions."""
        await self.log.sync(companions=True)

    async def close(self, queues: Iterable[Queue]) -> None:
        """Write and fsync the message log and the streams' logs (after any round in
        flight), then close them; `close_journals` follows. `queues` is read once, before
        the first await: a queue declared while the logs close (a request in flight
        during shutdown) must not break the iteration, and its declare fails on the
        closed log."""
        queues = list(queues)
        await self.log.close()
        for queue in queues:
            if queue.stream is not None:
                await queue.stream.log.close()

    def close_blocking(self, queues: Iterable[Queue]) -> None:
        """`close`, blocking (shutdown only)."""
        self.log.close_blocking()
        for queue in queues:
            if queue.stream is not None:
                queue.stream.log.close_blocking()

    def close_journals(self, queues: Iterable[Queue]) -> None:
        """Close the definitions journal and the queues' journals and stream files."""
        self.definitions.close()
        for queue in queues:
            if queue.stream is not None:
                queue.stream.offsets.close()
                queue.stream.publishers.close()
            if queue.cursor.journal is not None:
                queue.cursor.journal.close()


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
