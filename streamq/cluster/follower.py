"""The follower's side of replication: a byte-level mirror of the leader's data directory.

Owns one connection to the leader's clustering port (over TLS when given a context:
`link_tls`): the handshake, the full sync (it removes what the leader lacks, cuts a tail
the leader never had, asks for what differs), then the live action stream, applied with
an `ActionApplier` on one worker thread, fsynced in groups (whatever arrived while the
last group was applied), and acked only once fsynced. While its copy is not a consistent
state of the leader's (from the first change of a full sync until the stream reaches the
position the leader had when the sync ended) the data directory holds the
`.clustering_syncing` marker: a node with it never campaigns. Buffers are bounded: stream
bytes waiting to be applied stop the socket reads at APPLY_QUEUE_BYTES_MAX. It never opens
a Broker on the directory; the controller does, once this node is elected.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import ssl
from collections import deque
from collections.abc import Callable
from typing import Final, TypeVar
from urllib.parse import urlsplit

from streamq.cluster import replication as wire
from streamq.cluster.replica_progress import ReplicaProgress
from streamq.cluster.replication import ReplicationError
from streamq.cluster.sync import (
    SYNCING_MARKER,
    Entry,
    apply_removals,
    check_relative,
    fsync_tree,
    plan_sync,
)
from streamq.log.files import fsync_directory
from streamq.log.tap import ActionApplier, ActionError
from streamq.progress import Progress
from streamq.tls import failure_reason

logger = logging.getLogger(__name__)

T = TypeVar("T")

CONNECT_TIMEOUT_S: Final = 5.0
SYNC_IDLE_TIMEOUT_S: Final = 60.0
APPLY_QUEUE_BYTES_MAX: Final = 64 << 20
ENTRIES_MAX: Final = 4_000_000


def parse_uri(uri: str) -> tuple[str, int]:
    """("host", port) of "tcp://host:port"; ValueError otherwise."""
    parts = urlsplit(uri)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise ValueError(f"not a tcp://host:port replication address: {uri!r}")
    return parts.hostname, parts.port


class ReplicationClient:
    """Follows the leader at `leader_uri` ("tcp://host:port") into `data_dir`."""

    def __init__(
        self,
        data_dir: str,
        node_id: str,
        secret: str,
        leader_uri: str,
        tls: ssl.SSLContext | None = None,
        *,
        version: int = wire.VERSION,
        replica: ReplicaProgress | None = None,
    ) -> None:
        """`tls`: connect over TLS with this context (the leader's certificate is checked
        for the URI's host), else in clear text. `version`: of the replication protocol
        to speak (2 for a leader from before follower reads). `replica`: told what was
        received and committed, for the stream reads this node serves."""
        self.data_dir = os.path.abspath(data_dir)
        self.node_id = node_id
        self._secret = secret
        self.leader_uri = leader_uri
        self._tls = tls
        self._address = parse_uri(leader_uri)
        self.version = version
        self.replica = replica
        self.synced = False
        self.acked = 0
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def stop(self) -> None:
        """End `run()`: it returns (rather than raising) once its connection is closed."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()

    async def run(self) -> None:
        """Connect, authenticate, full sync, then follow until the connection ends.
        Raises ReplicationError(reason) then; returns only after `stop()`."""
        self._task = asyncio.current_task()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="streamq-follower"
        )
        try:
            await self._run()
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        except ReplicationError:
            if not self._stopping:
                raise
        except OSError as exc:
            if not self._stopping:
                raise ReplicationError(f"replication from {self.leader_uri} failed: {exc}") from exc
        finally:
            # Any write of ours still on the thread finishes before run() returns.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(asyncio.to_thread(self._executor.shutdown, wait=True))

    async def _run(self) -> None:
        if self._stopping:
            return
        if self.replica is not None:
            self.replica.stopped()  # reads wait: a full sync may rewrite files
        reader, writer = await self._connect()
        try:
            await asyncio.wait_for(self._handshake(reader, writer), wire.HANDSHAKE_TIMEOUT_S)
            start, consistent_at = await self._full_sync(reader, writer)
            await self._follow(reader, writer, start, consistent_at)
        finally:
            if self.replica is not None:
                self.replica.stopped()
            writer.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = self._address
        tls = self._tls
        connect = (
            asyncio.open_connection(host, port)
            if tls is None
            else asyncio.open_connection(
                host, port, ssl=tls, server_hostname=host, ssl_handshake_timeout=CONNECT_TIMEOUT_S
            )
        )
        try:
            return await asyncio.wait_for(connect, CONNECT_TIMEOUT_S)
        except ssl.SSLError as exc:
            reason = (
                f"TLS handshake with the leader at {self.leader_uri} failed: "
                f"{failure_reason(exc)} (the leader needs clustering TLS settings with a "
                "certificate from the same CA, for the host of its advertised URI)"
            )
            raise ReplicationError(reason) from exc
        except (OSError, TimeoutError) as exc:
            reason = f"cannot connect to the leader at {self.leader_uri}: {exc!r}"
            if tls is not None and isinstance(exc, ConnectionResetError | TimeoutError):
                reason += " (in the TLS handshake: does the leader speak TLS?)"
            raise ReplicationError(reason) from exc

    def _on_thread(self, fn: Callable[..., T], *args: object) -> asyncio.Future[T]:
        assert self._executor is not None
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(wire.hello(self.version))
        try:
            await wire.read_greeting(
                reader, self.leader_uri, tls=self._tls is not None, version=self.version
            )
        except ssl.SSLError as exc:  # the leader's alert, after our side of a TLS 1.3 handshake
            raise ReplicationError(
                f"the leader at {self.leader_uri} refused this node's certificate: "
                f"{failure_reason(exc)}; the secret was not sent"
            ) from exc
        writer.write(wire.secret_bytes(self._secret))
        try:
            answer = (await reader.readexactly(1))[0]
        except asyncio.IncompleteReadError:
            raise ReplicationError("the leader closed the connection in the handshake") from None
        if answer != wire.ACCEPTED:
            raise ReplicationError("the leader refused this node: wrong cluster secret")
        writer.write(wire.node_id_bytes(self.node_id))

    # Full sync.

    async def _full_sync(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[int, int]:
        """Make the copy match the leader's listing; returns SYNC_END's positions."""
        entries = await self._read_listing(reader)
        await self._on_thread(set_marker, self.data_dir)
        plan = await self._on_thread(plan_sync, self.data_dir, entries)
        await self._on_thread(apply_removals, self.data_dir, plan)
        # Requests go out from their own task while answers come in: the leader writes
        # a file while we would still be writing requests, and neither side may block.
        requests = asyncio.create_task(self._send_requests(writer, plan.request))
        progress = Progress(
            logger, f"clustering: full sync from {self.leader_uri}", len(plan.request), "files"
        )
        try:
            positions = await self._receive_files(reader, progress)
            await requests
        finally:
            requests.cancel()
        await self._on_thread(fsync_tree, self.data_dir)
        progress.finish()
        return positions

    async def _read_listing(self, reader: asyncio.StreamReader) -> list[Entry]:
        entries: list[Entry] = []
        while True:
            kind, body = await asyncio.wait_for(wire.read_frame(reader), SYNC_IDLE_TIMEOUT_S)
            if kind == wire.FILE_LIST_END:
                return entries
            if kind != wire.FILE_ENTRIES:
                raise ReplicationError(f"unexpected frame {kind} in the file list")
            for entry_kind, path, size, sha1 in wire.decode_entries(body):
                entries.append(Entry(path, entry_kind == wire.ENTRY_DIRECTORY, size, sha1))
            if len(entries) > ENTRIES_MAX:
                raise ReplicationError(f"the leader lists more than {ENTRIES_MAX} files")

    async def _send_requests(self, writer: asyncio.StreamWriter, wanted: list[Entry]) -> None:
        for entry in wanted:
            writer.write(wire.frame(wire.FILE_REQUEST, wire.encode_request(*_request(entry))))
            await writer.drain()
        writer.write(wire.frame(wire.REQUESTS_END))
        await writer.drain()

    async def _receive_files(
        self, reader: asyncio.StreamReader, progress: Progress
    ) -> tuple[int, int]:
        fd: int | None = None
        try:
            while True:
                kind, body = await asyncio.wait_for(wire.read_frame(reader), SYNC_IDLE_TIMEOUT_S)
                if kind == wire.SYNC_END and fd is None:
                    return wire.decode_sync_end(body)
                if kind == wire.FILE_BEGIN and fd is None:
                    start, raw_path = wire.decode_positioned(body)
                    path = check_relative(_decode_path(raw_path))
                    fd = await self._on_thread(open_copy, self.data_dir, path, start)
                elif kind == wire.FILE_DATA and fd is not None:
                    position, data = wire.decode_positioned(body)
                    await self._on_thread(write_at, fd, data, position)
                elif kind == wire.FILE_END and fd is not None:
                    await self._on_thread(finish_copy, fd, wire.parse_u64(body))
                    fd = None
                    progress.step()
                elif kind == wire.FILE_MISSING and fd is None:
                    path = check_relative(_decode_path(body))
                    await self._on_thread(remove_file, os.path.join(self.data_dir, path))
                    progress.step()
                else:
                    raise ReplicationError(f"unexpected frame {kind} during a full sync")
        finally:
            if fd is not None:
                await self._on_thread(os.close, fd)

    # The live stream.

    async def _follow(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        start: int,
        consistent_at: int,
    ) -> None:
        stream = _Stream(start)
        self.acked = start
        if self.replica is not None:
            self.replica.connected(start)
        if consistent_at <= start:
            await self._synced()
        # The first ack says "synced, streaming from here", even if nothing comes.
        writer.write(wire.frame(wire.ACK, wire.u64(start)))
        applier = ActionApplier(self.data_dir)
        receiving = asyncio.create_task(self._receive_stream(reader, stream))
        applying = asyncio.create_task(self._apply_stream(writer, stream, applier, consistent_at))
        try:
            done, _pending = await asyncio.wait(
                {receiving, applying}, return_when="FIRST_COMPLETED"
            )
            for task in done:
                task.result()
        finally:
            receiving.cancel()
            applying.cancel()
            await asyncio.gather(receiving, applying, return_exceptions=True)
            await self._on_thread(applier.close)

    async def _receive_stream(self, reader: asyncio.StreamReader, stream: _Stream) -> None:
        while True:
            kind, body = await wire.read_frame(reader)
            if kind == wire.COMMITTED and self.version >= wire.VERSION_COMMITTED:
                if self.replica is not None:
                    self.replica.commit(wire.parse_u64(body))
                continue
            if kind != wire.STREAM:
                raise ReplicationError(f"unexpected frame {kind} in the live stream")
            position, data = wire.decode_positioned(body)
            if position != stream.received:
                raise ReplicationError(f"stream at {position}, expected {stream.received}")
            stream.put(data)
            if self.replica is not None:
                # Before the bytes can reach the disk (they are applied on the thread).
                self.replica.received = stream.received
            while stream.queued_bytes > APPLY_QUEUE_BYTES_MAX:
                stream.space.clear()
                await stream.space.wait()

    async def _apply_stream(
        self,
        writer: asyncio.StreamWriter,
        stream: _Stream,
        applier: ActionApplier,
        consistent_at: int,
    ) -> None:
        while True:
            await stream.ready.wait()
            chunks = stream.take()
            try:
                await self._on_thread(apply_and_sync, applier, chunks)
            except ActionError as exc:
                raise ReplicationError(f"bad action from the leader: {exc}") from exc
            acked = stream.base + applier.applied
            # The marker goes before the ack that reaches `consistent_at`: the leader may
            # name this node in the ISR from that ack on (a node with it never campaigns).
            if not self.synced and acked >= consistent_at:
                await self._synced()
            if acked > self.acked:
                self.acked = acked
                writer.write(wire.frame(wire.ACK, wire.u64(acked)))
                await writer.drain()

    async def _synced(self) -> None:
        await self._on_thread(clear_marker, self.data_dir)
        self.synced = True
        if self.replica is not None:
            self.replica.consistent()


class _Stream:
    """Stream bytes received and not yet applied (bounded by the receiver's wait)."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.received = base
        self.queued_bytes = 0
        self._chunks: deque[bytes] = deque()
        self.ready = asyncio.Event()
        self.space = asyncio.Event()

    def put(self, data: bytes) -> None:
        self._chunks.append(data)
        self.queued_bytes += len(data)
        self.received += len(data)
        self.ready.set()

    def take(self) -> list[bytes]:
        chunks = list(self._chunks)
        self._chunks.clear()
        self.queued_bytes = 0
        self.ready.clear()
        self.space.set()
        return chunks


def _request(entry: Entry) -> tuple[str, int, bytes]:
    return entry.path, entry.size, entry.sha1


def _decode_path(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise ReplicationError("a path from the leader is not utf-8") from None


# Blocking work, on the follower's worker thread.


def apply_and_sync(applier: ActionApplier, chunks: list[bytes]) -> None:
    """Apply every chunk, then fsync what they changed (one group commit)."""
    for chunk in chunks:
        applier.feed(chunk)
    applier.sync()


def set_marker(root: str) -> None:
    """Create the `.clustering_syncing` marker, durable before any other change."""
    os.makedirs(root, exist_ok=True)
    fd = os.open(os.path.join(root, SYNCING_MARKER), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_directory(root)


def clear_marker(root: str) -> None:
    """The copy is consistent: remove the marker, durably."""
    remove_file(os.path.join(root, SYNCING_MARKER))
    fsync_directory(root)


def open_copy(root: str, path: str, start: int) -> int:
    """Open the follower's copy of `path` for a file transfer from `start` (cut there)."""
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    fd = os.open(full, os.O_WRONLY | os.O_CREAT, 0o644)
    os.ftruncate(fd, start)
    return fd


def write_at(fd: int, data: bytes | memoryview, position: int) -> None:
    """Write all of `data` at `position`: a short write (a filling disk) goes on from
    where it stopped; a full disk raises OSError (ENOSPC), which ends the connection,
    and the next one's full sync asks for the file again."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def finish_copy(fd: int, size: int) -> None:
    """The transfer is complete: the copy has `size` bytes, durable before returning."""
    try:
        os.ftruncate(fd, size)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def remove_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
