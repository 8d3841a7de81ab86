"""A follower's stream port: the leader's stream protocol, with reads served from here.

Owns `StreamProxy`, the listener on a follower's stream port. Every connection is piped
to the leader's stream listener frame by frame, so the leader does the handshake, the
permission checks, publishing, offsets, metadata and single active consumers, as it
does for its own clients; this node looks at a few frames only:

- the client's **Subscribe** (not for a single active consumer, nor a super stream's
  member) goes to the leader with credit 0: the leader checks the stream and the
  permissions and answers, and never delivers to it. Once the leader answered OK, this
  node serves the subscription from its copy (`replica_log`): the stored chunks of
  version-2 segments as the leader sends them (`read_stored_chunk`), those of version-1
  segments built as the leader builds them (`read_chunk`), only up to the committed
  end, for the client's
  **Credit** (not forwarded) until its **Unsubscribe** (forwarded too);
- the client's **SaslAuthenticate** as a user of `loopback_users` (guest) from an
  address that is not loopback is refused here, as the leader would: the leader sees
  this node's address, which may be loopback (the stream listener takes no PROXY
  header);
- the leader's **OpenResponse** gets this node's advertised host and port, as a
  RabbitMQ replica's does, so that clients that check where they landed
  (rstream's `load_balancer_mode`) find the replica they asked for;
- Tune (both ways) and ExchangeCommandVersions (the client's) give the frame size and
  the Deliver version; MetadataUpdate from the leader ends the stream's local
  subscriptions (the stream is gone).

Bounded: a frame is at most `frame_max` bytes (the limit of this node's stream
listener), and each direction waits for the other side's writes to drain. A connection
ends when either side closes; closing the proxy (the leader changed) closes them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import struct
from dataclasses import dataclass, field
from typing import Final

from stream_gateway.codec import StreamCodecError, decode, encode
from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import RESPONSE_FLAG, Key, OffsetType, ResponseCode
from stream_gateway.handshake import sasl_credentials
from stream_gateway.subscriptions import chunk_filter
from streamq.broker.users import login_allowed
from streamq.cluster.replica_log import ReplicaLog
from streamq.cluster.replica_progress import ReplicaProgress
from streamq.log.errors import LogError, OffsetOutOfRange
from streamq.queues.chunks import CHUNK_HEADER_BYTES, Chunk, ChunkFilter, read_chunk
from streamq.queues.stored_chunks import read_stored_chunk

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S: Final = 5.0
POLL_S: Final = 1.0  # a waiting subscription looks at the marker at least this often
CHUNK_RECORDS_MAX: Final = 8192  # as the leader's subscriptions
CREDIT_MAX: Final = 1 << 20
SUBSCRIPTIONS_MAX: Final = 256  # ids are bytes
_SIZE: Final = struct.Struct(">I")
_HEAD: Final = struct.Struct(">HH")
_DELIVER_V1: Final = struct.Struct(">IHHB")
_DELIVER_V2: Final = struct.Struct(">IHHBQ")
DELIVER_HEAD_BYTES: Final = _DELIVER_V2.size
_SAC_PROPERTIES: Final = ("single-active-consumer", "super-stream")


@dataclass(eq=False)
class _Local:
    """A subscription this node serves."""

    subscription_id: int
    stream: str
    spec: c.OffsetSpec
    credit: int
    filter: ChunkFilter | None
    more: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class StreamProxy:
    """This follower's stream listener, piping to the leader's at `leader`."""

    def __init__(
        self,
        leader: tuple[str, int],
        data_dir: str,
        progress: ReplicaProgress,
        *,
        advertised: tuple[str, int],
        frame_max: int,
    ) -> None:
        self.leader = leader
        self.data_dir = data_dir
        self.progress = progress
        self.advertised = advertised  # (host, port 0: the listener's)
        self.frame_max = frame_max
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, host, port)
        bound: int = self._server.sockets[0].getsockname()[1]
        if not self.advertised[1]:
            self.advertised = (self.advertised[0], bound)
        return bound

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.leader), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            logger.info("clustering: stream port: cannot reach the leader at %s: %s",
                        self.leader, exc)  # fmt: skip
            writer.close()
            self._connections.discard(task)
            return
        connection = _Connection(self, reader, writer, up_reader, up_writer)
        peer = writer.get_extra_info("peername")
        connection.peer_host = peer[0] if peer else ""
        try:
            await connection.run()
        except asyncio.CancelledError:
            pass
        finally:
            connection.close()
            self._connections.discard(task)


class _Connection:
    """One client's connection and its pipe to the leader."""

    def __init__(
        self,
        proxy: StreamProxy,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        self.proxy = proxy
        self.reader, self.writer = reader, writer
        self.up_reader, self.up_writer = up_reader, up_writer
        self.frame_max = proxy.frame_max
        self.deliver_v2 = False
        self.vhost = "/"
        self.peer_host = ""  # the client's address
        self.pending: dict[int, _Local] = {}  # Subscribe correlation id: the subscription
        self.local: dict[int, _Local] = {}  # by subscription id

    async def run(self) -> None:
        up = asyncio.create_task(self._from_client())
        down = asyncio.create_task(self._from_leader())
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    def close(self) -> None:
        for sub in self.local.values():
            if sub.task is not None:
                sub.task.cancel()
        self.local.clear()
        self.writer.close()
        self.up_writer.close()

    # -- frames ------------------------------------------------------------------------

    async def _frame(self, reader: asyncio.StreamReader) -> bytes | None:
        """The next frame, size field included; None at the end of the connection."""
        try:
            head = await reader.readexactly(_SIZE.size)
            (size,) = _SIZE.unpack(head)
            if size + _SIZE.size > max(self.frame_max, self.proxy.frame_max) or size < 4:
                return None  # the leader would refuse it too; the connection ends
            return head + await reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    async def _from_client(self) -> None:
        while (frame := await self._frame(self.reader)) is not None:
            key, _version = _HEAD.unpack_from(frame, 4)
            if key in (Key.SUBSCRIBE, Key.CREDIT, Key.UNSUBSCRIBE, Key.OPEN, Key.TUNE,
                       Key.EXCHANGE_COMMAND_VERSIONS):  # fmt: skip
                frame = self._client_command(frame)
            elif key == Key.SASL_AUTHENTICATE and (
                refusal := loopback_refusal(self.peer_host, frame)
            ):
                self.writer.write(refusal)  # as the leader answers; then the connection ends
                await self.writer.drain()
                return
            if frame:
                self.up_writer.write(frame)
                await self.up_writer.drain()

    async def _from_leader(self) -> None:
        while (frame := await self._frame(self.up_reader)) is not None:
            key, _version = _HEAD.unpack_from(frame, 4)
            if key in (Key.OPEN | RESPONSE_FLAG, Key.SUBSCRIBE | RESPONSE_FLAG, Key.TUNE,
                       Key.METADATA_UPDATE):  # fmt: skip
                frame = self._leader_command(frame)
            self.writer.write(frame)
            await self.writer.drain()

    def _client_command(self, frame: bytes) -> bytes:
        """What goes to the leader for a frame the client sent (b"": nothing)."""
        try:
            command = decode(memoryview(frame)[_SIZE.size :])
        except StreamCodecError:
            return frame  # the leader refuses it, with its code
        if isinstance(command, c.Subscribe):
            return self._subscribe(command, frame)
        if isinstance(command, c.Credit) and command.subscription_id in self.local:
            sub = self.local[command.subscription_id]
            sub.credit = min(sub.credit + command.credit, CREDIT_MAX)
            sub.more.set()
            return b""
        if isinstance(command, c.Unsubscribe):
            gone = self.local.pop(command.subscription_id, None)
            if gone is not None and gone.task is not None:
                gone.task.cancel()
        elif isinstance(command, c.Open):
            self.vhost = command.vhost
        elif isinstance(command, c.Tune | c.TuneResponse):
            self.frame_max = _lower(self.frame_max, command.frame_max)
        elif isinstance(command, c.ExchangeCommandVersions):
            self.deliver_v2 = any(
                v.key == Key.DELIVER and v.version_max >= 2 for v in command.versions
            )
        return frame

    def _subscribe(self, command: c.Subscribe, frame: bytes) -> bytes:
        if any(command.properties.get(name) for name in _SAC_PROPERTIES):
            return frame  # the leader serves it: its groups decide who is active
        if command.subscription_id in self.local or len(self.local) >= SUBSCRIPTIONS_MAX:
            return frame  # the leader refuses it (an id in use)
        self.pending[command.correlation_id] = _Local(
            command.subscription_id,
            command.stream,
            command.offset_spec,
            min(command.credit, CREDIT_MAX),
            chunk_filter(command.properties),
        )
        # Credit 0: the leader checks and answers, and never delivers to it.
        return encode(dataclasses.replace(command, credit=0))

    def _leader_command(self, frame: bytes) -> bytes:
        """What goes to the client for a frame the leader sent."""
        try:
            command = decode(memoryview(frame)[_SIZE.size :])
        except StreamCodecError:
            return frame
        if isinstance(command, c.OpenResponse) and command.response_code == ResponseCode.OK:
            host, port = self.proxy.advertised
            properties = {**command.properties, "advertised_host": host,
                          "advertised_port": str(port)}  # fmt: skip
            return encode(c.OpenResponse(command.correlation_id, command.response_code, properties))
        if isinstance(command, c.Tune | c.TuneResponse):
            self.frame_max = _lower(self.frame_max, command.frame_max)
        elif isinstance(command, c.Response) and command.key == Key.SUBSCRIBE:
            sub = self.pending.pop(command.correlation_id, None)
            if sub is not None and command.response_code == ResponseCode.OK:
                self._start(sub)
        elif isinstance(command, c.MetadataUpdate):
            for sub_id, sub in list(self.local.items()):
                if sub.stream == command.stream and sub.task is not None:
                    sub.task.cancel()
                    del self.local[sub_id]
        return frame

    # -- local subscriptions -------------------------------------------------------------

    def _start(self, sub: _Local) -> None:
        logger.info("clustering: stream subscription to %s (vhost %s) served from this "
                    "node's copy", sub.stream, self.vhost)  # fmt: skip
        self.local[sub.subscription_id] = sub
        # After the response: the task's first write comes after this frame's.
        sub.task = asyncio.get_running_loop().create_task(self._serve(sub))

    async def _serve(self, sub: _Local) -> None:
        directory = stream_directory(self.proxy.data_dir, self.vhost, sub.stream)
        log = ReplicaLog(directory, self.proxy.progress)
        wake = sub.more.set
        self.proxy.progress.listen(wake)
        try:
            while not log.known:
                sub.more.clear()
                log.refresh()
                if not log.known:
                    await _wait(sub.more)
            offset = _start_offset(log, sub.spec)
            while True:
                sub.more.clear()  # set again by credit, a commit or a full sync's end
                log.refresh()
                offset = await self._deliver(sub, log, offset)
                await _wait(sub.more)
        except LogError as exc:
            logger.warning("clustering: stream read of %s on this follower failed: %s",
                           sub.stream, exc)  # fmt: skip
            self.writer.close()
        except ConnectionError:
            pass  # the client went away: the connection's tasks end too
        finally:
            self.proxy.progress.unlisten(wake)
            log.close()

    async def _deliver(self, sub: _Local, log: ReplicaLog, offset: int) -> int:
        """Send chunks while there is credit and committed data; the next offset."""
        while sub.credit > 0 and self.proxy.progress.readable:
            bytes_max = self.frame_max - DELIVER_HEAD_BYTES - CHUNK_HEADER_BYTES
            try:
                chunk = _read_chunk(log, offset, bytes_max, sub.filter)
            except OffsetOutOfRange:
                log.refresh(relist=True)
                offset = max(offset, log.start_offset)
                continue
            if chunk is None:
                break
            offset = chunk.next_offset
            if not chunk.records:
                continue
            self.writer.writelines([self._deliver_head(sub, log, len(chunk.data)), chunk.data])
            sub.credit -= 1
            await self.writer.drain()
        return offset

    def _deliver_head(self, sub: _Local, log: ReplicaLog, size: int) -> bytes:
        if self.deliver_v2:
            committed = max(log.end - 1, 0)
            return _DELIVER_V2.pack(size + 13, Key.DELIVER, 2, sub.subscription_id, committed)
        return _DELIVER_V1.pack(size + 5, Key.DELIVER, 1, sub.subscription_id)


def loopback_refusal(peer_host: str, frame: bytes) -> bytes | None:
    """The leader's answer to a SaslAuthenticate `frame` (size field included) from
    `peer_host` that the loopback rule refuses (`users.login_allowed`), else None. The
    password is not checked here: the rule refuses the user whatever it is."""
    loopback = peer_host in ("127.0.0.1", "::1") or peer_host.startswith("127.")
    try:
        command = decode(memoryview(frame)[_SIZE.size :])
    except StreamCodecError:
        return None
    if loopback or not isinstance(command, c.SaslAuthenticate):
        return None
    credentials = sasl_credentials(command.mechanism, command.data or b"")
    if credentials is None or login_allowed(credentials[0], False):
        return None
    code = ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK
    return encode(c.SaslAuthenticateResponse(command.correlation_id, code))


def _read_chunk(
    log: ReplicaLog, offset: int, bytes_max: int, filter: ChunkFilter | None
) -> Chunk | None:
    """The chunk from `offset` (raised to the copy's start), as the leader's
    `StreamQueue.read_chunk` gives it."""
    offset = max(offset, log.start_offset)
    place = log.chunk_at(offset)
    if place is not None:  # a version-2 segment: the chunk as stored
        return read_stored_chunk(log, place, offset, filter)
    return read_chunk(log, offset, CHUNK_RECORDS_MAX, bytes_max, filter)  # type: ignore[arg-type]  # ReplicaLog has the part of SegmentLog read_chunk reads


def _start_offset(log: ReplicaLog, spec: c.OffsetSpec) -> int:
    """Where a subscription starts, as the leader's `subscriptions.start_offset` says,
    within the committed records (LAST: the last committed record)."""
    first, end = log.start_offset, log.end
    kind = spec.offset_type
    if kind == OffsetType.FIRST:
        return first
    if kind == OffsetType.LAST:
        return max(first, end - 1)
    if kind == OffsetType.OFFSET and spec.value is not None:
        return min(max(spec.value, first), end)
    if kind == OffsetType.TIMESTAMP and spec.value is not None:
        return log.first_at_or_after(spec.value)
    return end  # NEXT


async def _wait(event: asyncio.Event) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), POLL_S)


def stream_directory(data_dir: str, vhost: str, stream: str) -> str:
    """`<data dir>/vhosts/<sha1(vhost)>/streams/<sha1(stream)>`: where the broker keeps a
    stream's log (`Broker.vhost_dir`, `vhost_store`; the Spark source names it so too)."""
    vhost_digest = hashlib.sha1(vhost.encode()).hexdigest()
    stream_digest = hashlib.sha1(stream.encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(data_dir, "vhosts", vhost_digest, "streams", stream_digest)


def _lower(ours: int, theirs: int) -> int:
    return theirs if ours == 0 or 0 < theirs < ours else ours
