"""Delayed messages of `x-delayed-message` exchanges: held until their deadline.

Owns the messages that wait out their `x-delay`, in memory in a heap by deadline (no
timer per message: the gateway asks `due(now_ms)` from one timer for the nearest
deadline and from its housekeeping), and the file `delayed` of the vhost that keeps the
persistent ones (a durable exchange and delivery mode 2) across a restart, deadlines
included. It does not route: the vhost routes what comes due.

File format: an 8-byte header (`SQDL`, u16 version, u16 zero), then records, each a u32
length and the u32 CRC32C of its payload, then the payload: u8 kind; ADD carries u64
seq, u64 deadline ms, u16 + exchange, u16 + routing key, u32 + properties, body; REMOVE
carries u64 seq. Opening replays the records and stops at the first torn or corrupt one.

Durability: an ADD is buffered and durable after the next sync round (the vhost's sync
companion writes it; confirms wait for such a round). A REMOVE is written only in the
round after the one that made the released message's publish durable, so a crash in
between delivers it again rather than losing it (at least once, as the plugin).
"""

from __future__ import annotations

import heapq
import logging
import os
import struct
from collections.abc import Iterable
from typing import Final, NamedTuple

from streamq.log import files
from streamq.log._records import crc32c
from streamq.log.errors import OutOfSpace
from streamq.log.files import append_all, fsync_directory, write_all, write_file_atomic
from streamq.log.log import CompanionWork
from streamq.log.versions import refuse_newer

logger = logging.getLogger(__name__)

MAGIC: Final = b"SQDL"
VERSION: Final = 1
HEADER: Final = struct.Struct("<4sHH")
PREFIX: Final = struct.Struct("<II")  # payload length, crc32c of the payload
ADD: Final = 1
REMOVE: Final = 2
_ADD_FIXED: Final = struct.Struct("<BQQ")
_REMOVE: Final = struct.Struct("<BQ")
_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
RECORD_BYTES_MAX: Final = 1 << 30  # a longer record is damage, not a message
COMPACT_DEAD_MIN: Final = 4096  # records of removed messages before a rewrite is worth it
COMPACT_RATIO: Final = 4


class DelayedMessage(NamedTuple):
    seq: int
    deadline_ms: int
    exchange: str
    routing_key: str
    properties_raw: bytes
    body: bytes
    persistent: bool


def encode_add(m: DelayedMessage) -> bytes:
    exchange = m.exchange.encode("utf-8", "surrogateescape")
    routing_key = m.routing_key.encode("utf-8", "surrogateescape")
    payload = b"".join(
        (
            _ADD_FIXED.pack(ADD, m.seq, m.deadline_ms),
            _U16.pack(len(exchange)),
            exchange,
            _U16.pack(len(routing_key)),
            routing_key,
            _U32.pack(len(m.properties_raw)),
            m.properties_raw,
            m.body,
        )
    )
    return PREFIX.pack(len(payload), crc32c(payload)) + payload


def encode_remove(seq: int) -> bytes:
    payload = _REMOVE.pack(REMOVE, seq)
    return PREFIX.pack(len(payload), crc32c(payload)) + payload


def _decode_add(payload: bytes) -> DelayedMessage:
    _, seq, deadline = _ADD_FIXED.unpack_from(payload, 0)
    at = _ADD_FIXED.size
    (n,) = _U16.unpack_from(payload, at)
    exchange = payload[at + 2 : at + 2 + n].decode("utf-8", "surrogateescape")
    at += 2 + n
    (n,) = _U16.unpack_from(payload, at)
    routing_key = payload[at + 2 : at + 2 + n].decode("utf-8", "surrogateescape")
    at += 2 + n
    (n,) = _U32.unpack_from(payload, at)
    properties = payload[at + 4 : at + 4 + n]
    if len(properties) != n:
        raise ValueError("short properties")
    return DelayedMessage(
        seq, deadline, exchange, routing_key, properties, payload[at + 4 + n :], True
    )


def replay(data: bytes) -> tuple[dict[int, DelayedMessage], bool]:
    """The live messages of a file's contents, and whether the file was clean (no torn
    or corrupt tail, no removed messages)."""
    live: dict[int, DelayedMessage] = {}
    if len(data) < HEADER.size:
        return live, not data
    magic, version, _ = HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a delayed-messages file of version {VERSION}")
    at = HEADER.size
    clean = True
    while at < len(data):
        if at + PREFIX.size > len(data):
            return live, False
        length, crc = PREFIX.unpack_from(data, at)
        payload = data[at + PREFIX.size : at + PREFIX.size + length]
        if length > RECORD_BYTES_MAX or len(payload) != length or crc32c(payload) != crc:
            return live, False
        at += PREFIX.size + length
        try:
            if payload[0] == ADD:
                message = _decode_add(payload)
                live[message.seq] = message
            elif payload[0] == REMOVE:
                live.pop(_REMOVE.unpack_from(payload, 0)[1], None)
                clean = False
            else:
                return live, False
        except (ValueError, struct.error, IndexError):
            return live, False
    return live, clean


def valid_bytes(data: bytes) -> int:
    """The length of the records of a file's contents before the first torn or corrupt
    one (what `replay` reads)."""
    at = HEADER.size
    while at + PREFIX.size <= len(data):
        length, crc = PREFIX.unpack_from(data, at)
        payload = data[at + PREFIX.size : at + PREFIX.size + length]
        if length > RECORD_BYTES_MAX or len(payload) != length or crc32c(payload) != crc:
            break
        try:  # a record `replay` stops at (appends after it would never be read)
            if payload[0] == ADD:
                _decode_add(payload)
            elif payload[0] != REMOVE:
                break
        except (ValueError, struct.error, IndexError):
            break
        at += PREFIX.size + length
    return at


def _keep_on_full_disk(path: str, valid: int, why: OutOfSpace) -> None:
    """Start-up on a full disk: keep the file rather than rewrite it (its removed records
    replay to the same messages), cutting a torn tail off in place, which needs no room."""
    fd = files.open_fd(path, os.O_WRONLY)
    try:
        if os.fstat(fd).st_size > valid:
            files.ftruncate(fd, valid)
            os.fsync(fd)
    finally:
        files.close_fd(fd)
    logger.warning("delayed messages: %s not rewritten at start-up (%s); kept as it is", path, why)


class DelayedStore:
    """The delayed messages of one vhost; used from the event-loop thread only."""

    def __init__(self, path: str, fd: int, live: dict[int, DelayedMessage]) -> None:
        self.path = path
        self._fd = fd
        self._messages = dict(live)
        self._heap = [(m.deadline_ms, m.seq) for m in live.values()]
        heapq.heapify(self._heap)
        self._next_seq = max(live, default=0) + 1
        self._buffer = bytearray()
        self._released: list[int] = []  # persistent, published, publish not yet durable
        self._removable: list[int] = []  # their publish is durable: write REMOVE
        self._persisted = sum(1 for m in live.values() if m.persistent)
        self._dead = 0
        self.unsynced = False  # an ADD waits for a sync round

    @classmethod
    def open(cls, path: str) -> DelayedStore:
        """Open (or create) the file and load its messages. A file with removed or torn
        records is rewritten with its live ones first: fsyncs file and directory before
        returning (start-up only). Raises OSError, ValueError (a foreign file) and
        NewerFormat."""
        data = b""
        if os.path.exists(path):
            with open(path, "rb") as file:
                data = file.read()
        if len(data) >= HEADER.size and data[:4] == MAGIC:
            refuse_newer(path, "delayed messages", HEADER.unpack_from(data)[1], VERSION)
        live, clean = replay(data)
        if not clean or not data:
            if not clean:
                logger.info("delayed messages: rewriting %s with %d live", path, len(live))
            whole = HEADER.pack(MAGIC, VERSION, 0) + _encode_all(live.values())
            try:
                write_file_atomic(path, whole, fsync_dir=True)
            except OutOfSpace as exc:
                if len(data) < HEADER.size:
                    raise  # no file to keep: the vhost cannot start without room
                _keep_on_full_disk(path, valid_bytes(data), exc)
        fd = files.open_fd(path, os.O_WRONLY | os.O_APPEND)
        return cls(path, fd, live)

    def __len__(self) -> int:
        return len(self._messages)

    def messages(self) -> list[DelayedMessage]:
        return list(self._messages.values())

    def add(
        self,
        exchange: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
        deadline_ms: int,
        persistent: bool,
    ) -> bool:
        """Hold a message; True if its deadline is now the nearest. Persistent ones are
        buffered: durable after the next sync round."""
        seq = self._next_seq
        self._next_seq = seq + 1
        message = DelayedMessage(
            seq, deadline_ms, exchange, routing_key, properties_raw, body, persistent
        )
        self._messages[seq] = message
        nearest = not self._heap or deadline_ms < self._heap[0][0]
        heapq.heappush(self._heap, (deadline_ms, seq))
        if persistent:
            self._buffer += encode_add(message)
            self._persisted += 1
            self.unsynced = True
        return nearest

    def next_deadline_ms(self) -> int | None:
        heap = self._heap
        while heap and heap[0][1] not in self._messages:
            heapq.heappop(heap)  # dropped with its exchange
        return heap[0][0] if heap else None

    def due(self, now_ms: int) -> list[DelayedMessage]:
        """Take the messages whose deadline has come, earliest first. The caller
        publishes them; their removal from the file follows that publish's sync."""
        out: list[DelayedMessage] = []
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            _, seq = heapq.heappop(heap)
            message = self._messages.pop(seq, None)
            if message is not None:
                out.append(message)
                if message.persistent:
                    self._released.append(seq)
        return out

    def drop_exchange(self, exchange: str) -> int:
        """Forget the messages of a deleted exchange; returns how many."""
        gone = [m for m in self._messages.values() if m.exchange == exchange]
        for message in gone:
            del self._messages[message.seq]
            if message.persistent:
                self._removable.append(message.seq)
        return len(gone)

    @property
    def dirty(self) -> bool:
        """Whether something waits for a sync round."""
        return bool(self._buffer or self._released or self._removable)

    def prepare_sync(self) -> CompanionWork:
        """The vhost log's sync companion: write what is buffered (and the removals whose
        publish an earlier round made durable); hand the round the descriptor.

        Raises OutOfSpace when the file system has no room, with the file cut back and
        nothing changed here: the log holds its round and calls this again, in order."""
        removing = self._removable
        dead = self._dead + 2 * len(removing)
        persisted = self._persisted - len(removing)
        compact = dead >= COMPACT_DEAD_MIN and dead >= COMPACT_RATIO * persisted
        data = b""
        if not compact:
            data = bytes(self._buffer) + b"".join(encode_remove(seq) for seq in removing)
            if data:
                append_all(self._fd, data)
        self.unsynced = False
        self._buffer = bytearray()
        self._dead, self._persisted = dead, persisted
        # Released messages become removable once this round has synced their publish.
        self._removable, self._released = self._released, []
        if compact:
            return self._compact()
        return CompanionWork((self._fd,) if data else ())

    def _compact(self) -> CompanionWork:
        """Replace the file with the persistent messages not yet removed durably (the
        snapshot includes everything buffered); the new file is written, fsynced and
        renamed on the fsync thread, after the round's other fsyncs."""
        # Messages released before this round are left out: the round makes their
        # publish durable before the new file replaces the old one.
        keep = [m for m in self._messages.values() if m.persistent]
        snapshot = HEADER.pack(MAGIC, VERSION, 0) + _encode_all(keep)
        self._buffer = bytearray()
        self._removable = []
        self._dead = 0
        self._persisted = len(keep)
        tmp = self.path + ".tmp"
        fd = files.open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        files.close_fd(self._fd)
        self._fd = fd
        work = files.dup_fd(fd)
        path = self.path

        def replace() -> None:
            try:
                files.ftruncate(work, 0)  # a run after a full disk starts again
                append_all(work, snapshot)
            except OutOfSpace:
                raise  # `work` kept open: the round runs this again when there is room
            except BaseException:
                files.close_fd(work)
                raise
            try:
                os.fsync(work)
            finally:
                files.close_fd(work)
            files.replace(tmp, path)
            fsync_directory(os.path.dirname(path))

        return CompanionWork((), (replace,))

    def close(self) -> None:
        """Write what is buffered and the removal of every released message, fsync, and
        close. Call after the log's last sync round (it made those publishes durable)."""
        if self._fd < 0:
            return
        try:
            for seq in self._removable + self._released:
                self._buffer += encode_remove(seq)
            self._removable, self._released = [], []
            if self._buffer:
                write_all(self._fd, self._buffer)
                self._buffer = bytearray()
                os.fsync(self._fd)
        finally:
            files.close_fd(self._fd)
            self._fd = -1


def _encode_all(messages: Iterable[DelayedMessage]) -> bytes:
    return b"".join(encode_add(m) for m in messages if m.persistent)
