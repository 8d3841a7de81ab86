"""The leader's side of replication: the clustering port, full syncs, the live stream, and
the gate that holds fsync rounds until every in-sync replica has them.

Owns one connection per follower (at most one per node id: a second one replaces the
first) and the I/O the ISR rules of `isr` call for: acks in, `set_isr` writes out, rounds
released. A follower gets the file list of the data directory, the files it asks for, then
the tap's action stream from the position the tap had when it connected. Every buffer is
bounded: a stream read is at most STREAM_READ_BYTES_MAX and waits for the socket to drain;
the tap retains what the slowest follower still needs, up to its own limit (a follower that
needs trimmed bytes is disconnected and syncs again).
With a TLS context (`link_tls`) the port speaks only TLS, through `streamq.tls.serve_tls`
(a failed handshake is logged there); a peer refused in the handshake is logged here.
It must not release a round while the lease may have lapsed, nor before etcd's ISR names
no member that lacks it; after `fence()` it releases nothing ever again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import ssl
import time
from collections.abc import Callable
from typing import Final, Protocol

from streamq.cluster import replication as wire
from streamq.cluster.checksums import fd_sha1
from streamq.cluster.isr import Done, Follower, FollowerStatus, IsrState
from streamq.cluster.replication import ReplicationError
from streamq.cluster.sync import check_relative, list_tree
from streamq.log.errors import ReplicationFenced
from streamq.log.tap import FileTap, TapTrimmed
from streamq.tls import serve_tls

logger = logging.getLogger(__name__)

STREAM_READ_BYTES_MAX: Final = 4 << 20
STREAM_READER_LIMIT: Final = 1 << 16  # asyncio.start_server's default buffer limit
FILE_CHUNK_BYTES: Final = 1 << 20
ENTRIES_FRAME_BYTES: Final = 256 << 10
# A syncing follower that sends nothing for this long is disconnected.
SYNC_IDLE_TIMEOUT_S: Final = 60.0
# How often the ISR is checked for late followers when nothing else wakes it.
MAINTAIN_INTERVAL_S: Final = 0.1
ISR_WRITE_TIMEOUT_S: Final = 5.0
# A follower replaced by a new connection of the same node gets this long to go.
REPLACE_TIMEOUT_S: Final = 5.0


def _context_source(
    tls: ssl.SSLContext | Callable[[], ssl.SSLContext] | None,
) -> Callable[[], ssl.SSLContext] | None:
    if isinstance(tls, ssl.SSLContext):
        context = tls
        return lambda: context
    return tls


class IsrStore(Protocol):
    async def set_isr(self, ids: frozenset[str]) -> bool: ...


class _Session:
    def __init__(self, node_id: str, host: str, cursor: int, version: int) -> None:
        self.node_id = node_id
        self.host = host
        self.cursor = cursor  # the next stream position to send
        self.version = version  # of the replication protocol, as the follower's hello
        self.committed_sent = 0  # the last COMMITTED position sent (version 3)
        self.follower = Follower(node_id, host, cursor)
        self.wake = asyncio.Event()
        self.task = asyncio.current_task()


class ReplicationServer:
    """The leader's replication server; also the Syncer's ReplicationGate.

    It starts with the ISR {node_id}: the controller writes that to etcd before creating
    it (a wider ISR in etcd than here would let a round out without a member)."""

    def __init__(
        self,
        tap: FileTap,
        node_id: str,
        secret: str,
        isr_store: IsrStore,
        *,
        lease_valid: Callable[[], bool],
        ack_timeout_s: float = 3.0,
        tls: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
        inherited: frozenset[str] = frozenset(),
    ) -> None:
        """`tls`: serve TLS with this context, or the one it returns at each accept (a
        reload swaps it), on uvloop only; None: clear text. `inherited`: the members of
        the ISR this leader was elected from, which it wrote to etcd with itself: each
        has `ack_timeout_s` to reconnect and catch up before it is dropped (isr rule 4)."""
        self.tap = tap
        self.node_id = node_id
        self._secret = secret.encode()
        self._isr_store = isr_store
        self._lease_valid = lease_valid
        self.ack_timeout_s = ack_timeout_s
        self._tls = _context_source(tls)
        self._state = IsrState(node_id, tap.position, time.monotonic(), inherited, ack_timeout_s)
        self._sessions: dict[str, _Session] = {}
        self._handlers: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._maintainer: asyncio.Task[None] | None = None
        self._maintain_wake = asyncio.Event()
        self._growth_scheduled = False
        self._fenced = False
        # Starts an empty fsync round through this gate (the broker's `Syncer.barrier`,
        # set once the broker exists): a follower that starts streaming then hears of a
        # committed position covering what it has, even on a cluster nobody writes to.
        self.request_round: Callable[[], object] | None = None

    async def start(self, bind: str, port: int) -> int:
        """Listen on the clustering port; returns the bound port."""
        self._loop = asyncio.get_running_loop()
        if self._tls is None:
            self._server = await asyncio.start_server(self._handle, bind, port)
        else:
            self._server = await serve_tls(self._stream_protocol, bind, port, self._tls,
                                           "clustering: replication port")  # fmt: skip
        self.tap.listener = self._on_record
        self._maintainer = asyncio.create_task(self._maintain())
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    def _stream_protocol(self) -> asyncio.BaseProtocol:
        # What asyncio.start_server makes per connection, behind serve_tls's TLS.
        reader = asyncio.StreamReader(limit=STREAM_READER_LIMIT)
        return asyncio.StreamReaderProtocol(reader, self._handle)

    async def close(self) -> None:
        """Stop serving; held rounds fail (as after `fence`)."""
        self.fence()
        if self.tap.listener == self._on_record:
            self.tap.listener = None
        if self._server is not None:
            self._server.close()
        tasks = [*self._handlers, *([self._maintainer] if self._maintainer else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # The gate.

    def hold(self, done: Done) -> None:
        """ReplicationGate: called on the fsync thread after a round's fsyncs."""
        position = self.tap.position
        loop = self._loop
        if self._fenced or loop is None:
            done(ReplicationFenced())
            return
        try:
            loop.call_soon_threadsafe(self._hold, position, done)
        except RuntimeError:  # the loop is closed: this node is going away
            done(ReplicationFenced())

    def _hold(self, position: int, done: Done) -> None:
        if self._fenced:
            done(ReplicationFenced())
            return
        self._state.hold(position, done, time.monotonic())
        self._release()

    def fence(self) -> None:
        """Stepping down: every held and future round fails with ReplicationFenced, and
        every follower is disconnected."""
        if self._fenced:
            return
        self._fenced = True
        held = list(self._state.held)
        self._state.held.clear()
        for _position, done in held:
            done(ReplicationFenced())
        for session in self._sessions.values():
            if session.task is not None:
                session.task.cancel()

    def _release(self) -> None:
        if self._fenced:
            return
        ready = self._state.releasable(lease_valid=self._lease_valid())
        for done in ready:
            done(None)
        if ready:  # the committed position moved: followers reading hear of it
            for session in self._sessions.values():
                session.wake.set()

    # What operators and the node see.

    @property
    def isr(self) -> frozenset[str]:
        return self._state.isr

    def followers(self) -> list[FollowerStatus]:
        return self._state.status(time.monotonic())

    def follower_hosts(self) -> frozenset[str]:
        return frozenset(session.host for session in self._sessions.values())

    # The tap's growth, seen on the loop.

    def _on_record(self) -> None:
        """The tap's listener: any thread, once per recorded action; coalesced into one
        loop callback until that callback runs."""
        if self._growth_scheduled or self._loop is None:
            return
        self._growth_scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop is closed
            self._loop.call_soon_threadsafe(self._on_growth)

    def _on_growth(self) -> None:
        self._growth_scheduled = False
        self._state.grown(self.tap.position, time.monotonic())
        for session in self._sessions.values():
            session.wake.set()

    # The ISR: drops and joins written to etcd (isr module, rules 2 and 3).

    async def _maintain(self) -> None:
        while not self._fenced:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._maintain_wake.wait(), MAINTAIN_INTERVAL_S)
            self._maintain_wake.clear()
            try:
                await self._maintain_once()
            except Exception:
                # Rounds must not stall behind a dead task: log and check again.
                logger.exception("clustering: ISR maintenance failed")

    async def _maintain_once(self) -> None:
        state = self._state
        drops = state.drops(time.monotonic(), self.ack_timeout_s)
        if drops and await self._write_isr(frozenset(state.committed - drops)):
            state.dropped(drops)
            logger.warning("clustering: dropped %s from the ISR", ", ".join(sorted(drops)))
        for node_id in state.join_ready():
            ok = await self._write_isr(frozenset(state.committed | {node_id}))
            state.joined(node_id, ok=ok)
            if ok:
                logger.info("clustering: %s joined the ISR", node_id)
        self._release()

    async def _write_isr(self, ids: frozenset[str]) -> bool | None:
        """True: etcd holds `ids`; False: refused (not leader); None: unknown outcome."""
        try:
            return await asyncio.wait_for(self._isr_store.set_isr(ids), ISR_WRITE_TIMEOUT_S)
        except Exception as exc:
            logger.warning("clustering: writing the ISR failed: %s", exc)
            return None

    # One follower's connection.

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        session = None
        try:
            try:
                node_id, version = await asyncio.wait_for(
                    self._handshake(reader, writer), wire.HANDSHAKE_TIMEOUT_S
                )
            except (ReplicationError, OSError, TimeoutError) as exc:
                peer = writer.get_extra_info("peername")
                logger.warning("clustering: refused replication peer %s: %s", peer, exc)
                return
            session = await self._register(node_id, version, writer)
            await self._full_sync(session, reader, writer)
            await self._follow(session, reader, writer)
        except (ReplicationError, OSError, TapTrimmed, TimeoutError) as exc:
            who = session.node_id if session else writer.get_extra_info("peername")
            logger.info("clustering: follower %s disconnected: %s", who, exc)
        except asyncio.CancelledError:
            # close(): end quietly. A handler task of asyncio.start_server that ends
            # cancelled is logged by asyncio as an exception in a callback.
            pass
        finally:
            self._handlers.discard(task)
            if session is not None:
                self._unregister(session)
            writer.close()

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[str, int]:
        version = await wire.read_hello(reader)
        writer.write(wire.hello(version))
        secret = await wire.read_secret(reader)
        if not hmac.compare_digest(secret, self._secret):
            writer.write(bytes([wire.REFUSED]))
            await writer.drain()
            raise ReplicationError("refused a follower with a wrong secret")
        writer.write(bytes([wire.ACCEPTED]))
        node_id = await wire.read_node_id(reader)
        if node_id == self.node_id:
            raise ReplicationError(f"a follower claims this leader's node id {node_id}")
        return node_id, version

    async def _register(self, node_id: str, version: int, writer: asyncio.StreamWriter) -> _Session:
        old = self._sessions.get(node_id)
        if old is not None and old.task is not None:
            old.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(old.task), REPLACE_TIMEOUT_S)
        if self._fenced:
            raise ReplicationError("this node is no longer the leader")
        host = writer.get_extra_info("peername")[0]
        session = _Session(node_id, host, self.tap.position, version)
        self._sessions[node_id] = session
        self._state.followers[node_id] = session.follower
        self._maintain_wake.set()
        return session

    def _unregister(self, session: _Session) -> None:
        if self._sessions.get(session.node_id) is session:
            del self._sessions[session.node_id]
        self._state.remove_follower(session.node_id, session.follower)
        self._trim()
        self._maintain_wake.set()

    def _trim(self) -> None:
        need = min((s.cursor for s in self._sessions.values()), default=self.tap.position)
        self.tap.trim(need)

    # Full sync.

    async def _full_sync(
        self, session: _Session, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        entries = await asyncio.to_thread(list_tree, self.tap.root)
        body = bytearray()
        for entry in entries:
            kind = wire.ENTRY_DIRECTORY if entry.is_directory else wire.ENTRY_FILE
            body += wire.encode_entry(kind, entry.path, entry.size, entry.sha1)
            if len(body) >= ENTRIES_FRAME_BYTES:
                writer.write(wire.frame(wire.FILE_ENTRIES, body))
                body = bytearray()
                await writer.drain()
        if body:
            writer.write(wire.frame(wire.FILE_ENTRIES, body))
        writer.write(wire.frame(wire.FILE_LIST_END))
        while True:
            kind, body_in = await asyncio.wait_for(wire.read_frame(reader), SYNC_IDLE_TIMEOUT_S)
            if kind == wire.REQUESTS_END:
                break
            if kind != wire.FILE_REQUEST:
                raise ReplicationError(f"unexpected frame {kind} during a full sync")
            await self._send_file(writer, *wire.decode_request(body_in))
        session.follower.consistent_at = self.tap.position
        end = wire.encode_sync_end(session.cursor, session.follower.consistent_at)
        writer.write(wire.frame(wire.SYNC_END, end))

    async def _send_file(
        self, writer: asyncio.StreamWriter, path: str, size: int, sha1: bytes
    ) -> None:
        """The file from the follower's size when its copy is a prefix of ours, else all
        of it, up to the size it had when opened (later changes come with the stream)."""
        full = os.path.join(self.tap.root, check_relative(path))
        try:
            fd = await asyncio.to_thread(os.open, full, os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            writer.write(wire.frame(wire.FILE_MISSING, path.encode()))
            return
        try:
            end = os.fstat(fd).st_size
            start = 0
            if 0 < size <= end and await asyncio.to_thread(fd_sha1, fd, size) == sha1:
                start = size
            writer.write(wire.frame(wire.FILE_BEGIN, wire.encode_positioned(start, path.encode())))
            position = start
            while position < end:
                count = min(FILE_CHUNK_BYTES, end - position)
                data = await asyncio.to_thread(os.pread, fd, count, position)
                if not data:
                    break  # the file was cut shorter meanwhile
                writer.write(wire.frame(wire.FILE_DATA, wire.encode_positioned(position, data)))
                position += len(data)
                await writer.drain()
            writer.write(wire.frame(wire.FILE_END, wire.u64(position)))
        finally:
            os.close(fd)

    # The live stream.

    async def _follow(
        self, session: _Session, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        session.follower.state = "streaming"
        self._maintain_wake.set()
        if self.request_round is not None and session.version >= wire.VERSION_COMMITTED:
            with contextlib.suppress(RuntimeError):  # the broker is closing
                self.request_round()
        sender = asyncio.create_task(self._send_stream(session, writer))
        acks = asyncio.create_task(self._read_acks(session, reader))
        try:
            done, _pending = await asyncio.wait({sender, acks}, return_when="FIRST_COMPLETED")
            for task in done:
                task.result()
            raise ReplicationError("replication connection ended")
        finally:
            sender.cancel()
            acks.cancel()
            await asyncio.gather(sender, acks, return_exceptions=True)

    async def _send_stream(self, session: _Session, writer: asyncio.StreamWriter) -> None:
        while True:
            self._send_committed(session, writer)
            if self.tap.position <= session.cursor:
                session.wake.clear()
                if self.tap.position <= session.cursor and not self._committed_due(session):
                    await session.wake.wait()
                continue
            data = self.tap.read(session.cursor, STREAM_READ_BYTES_MAX)
            body_length = 8 + len(data)
            writer.write(wire.frame_head(wire.STREAM, body_length) + wire.u64(session.cursor))
            writer.write(data)
            session.cursor += len(data)
            self._trim()
            await writer.drain()

    def _committed_due(self, session: _Session) -> bool:
        """Whether the follower has not heard of the committed position it may use."""
        if session.version < wire.VERSION_COMMITTED:
            return False
        return min(self._state.released, session.cursor) > session.committed_sent

    def _send_committed(self, session: _Session, writer: asyncio.StreamWriter) -> None:
        """COMMITTED: what every in-sync replica has and the leader released, capped at
        what this follower was sent (it reads no further than it received anyway)."""
        if self._committed_due(session):
            session.committed_sent = min(self._state.released, session.cursor)
            writer.write(wire.frame(wire.COMMITTED, wire.u64(session.committed_sent)))

    async def _read_acks(self, session: _Session, reader: asyncio.StreamReader) -> None:
        while True:
            kind, body = await wire.read_frame(reader)
            if kind != wire.ACK:
                raise ReplicationError(f"unexpected frame {kind} from a streaming follower")
            position = wire.parse_u64(body)
            if position > session.cursor:
                raise ReplicationError(f"ack of {position}, past what was sent")
            state = self._state
            joining = session.node_id in state.pending
            state.ack(session.node_id, position)
            if not joining and session.node_id in state.pending:
                self._maintain_wake.set()
            self._release()
