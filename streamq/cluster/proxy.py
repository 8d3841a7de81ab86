"""A follower's forwarders: its client ports piped to the leader's, as LavinMQ's followers
proxy.

Owns `Forwarder`, one listening socket on this node (its AMQP, HTTP, AMQPS, HTTPS, MQTT
or MQTTS port) whose every connection is piped, byte for byte, to the matching address of
the leader; an AMQP or MQTT forwarder first sends a PROXY protocol v1 header naming the
client, so that the leader shows (and judges, loopback rule included) the client rather
than this node. TLS ports are piped as they are: the TLS session is the client's with
the leader.

Bounded: each direction stops reading from one side while the other side's write buffer
is above its high-water mark (asyncio's flow control: `pause_writing` on one protocol
pauses reading on its peer), so a slow end never makes this process buffer without limit.
A forwarder closed (the leader went away, this node is taking over) closes every
connection it piped. It never looks at the bytes, apart from writing the header.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import Final, cast

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S: Final = 5.0  # the leader's port must accept within this
WRITE_BUFFER_BYTES_HIGH: Final = 256 * 1024  # per direction: reading pauses above this
WRITE_BUFFER_BYTES_LOW: Final = 64 * 1024
EARLY_BYTES_MAX: Final = 1 << 20  # read from a client before the leader's side connected

Address = tuple[str, int]


def proxy_v1_header(client: Address, local: Address) -> bytes:
    """The PROXY protocol v1 line naming `client` as the source and `local` (the address
    the client dialled on this node) as the destination (HAProxy's proxy-protocol.txt)."""
    source, destination = ipaddress.ip_address(client[0]), ipaddress.ip_address(local[0])
    if source.version != destination.version:
        return b"PROXY UNKNOWN\r\n"  # the spec's answer when the families differ
    family = "TCP4" if source.version == 4 else "TCP6"
    return f"PROXY {family} {source} {destination} {client[1]} {local[1]}\r\n".encode()


def split_address(text: str) -> Address:
    """ "host:port" (an IPv6 host in brackets or not) as (host, port)."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


class _Pipe(asyncio.Protocol):
    """One side of a piped connection: what it reads goes to its peer's transport."""

    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None
        self.early = bytearray()  # read before the peer was connected (bounded)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(WRITE_BUFFER_BYTES_HIGH, WRITE_BUFFER_BYTES_LOW)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
            return
        # The leader's side is still being dialled (a transport may deliver a first read
        # although reading was paused in connection_made: uvloop starts reading after it).
        self.early += data
        if self.transport is not None:
            self.transport.pause_reading()
            if len(self.early) > EARLY_BYTES_MAX:
                self.transport.abort()

    def eof_received(self) -> bool:
        peer = self.peer
        if peer is not None and peer.transport is not None and peer.transport.can_write_eof():
            peer.transport.write_eof()
            return True  # half-closed: the other direction may still carry bytes
        return False

    def pause_writing(self) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.pause_reading()

    def resume_writing(self) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.forwarder.discard(self)
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class _ClientPipe(_Pipe):
    """The accepted side: it reads nothing until the leader's side is connected."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.pause_reading()
        self.forwarder.track(self)
        self.forwarder.connect_upstream(self)


class Forwarder:
    """Connections to this node's `what` port (its name in logs: "AMQP", "HTTP"...) piped
    to `target`, the leader's; with `proxy_header`, each starts with a PROXY v1 header."""

    def __init__(self, what: str, target: Address, *, proxy_header: bool) -> None:
        self.what = what
        self.target = target
        self.proxy_header = proxy_header
        self._server: asyncio.Server | None = None
        self._pipes: set[_Pipe] = set()
        self._connecting: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port; returns the bound port. Raises OSError if it cannot."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ClientPipe(self), host, port, reuse_address=True
        )
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        return sum(1 for pipe in self._pipes if isinstance(pipe, _ClientPipe))

    def track(self, pipe: _Pipe) -> None:
        self._pipes.add(pipe)

    def discard(self, pipe: _Pipe) -> None:
        self._pipes.discard(pipe)

    def connect_upstream(self, client: _ClientPipe) -> None:
        task = asyncio.get_running_loop().create_task(self._connect(client))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect(self, client: _ClientPipe) -> None:
        loop = asyncio.get_running_loop()
        upstream = _Pipe(self)
        upstream.peer, client.peer = client, upstream
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: upstream, *self.target), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            logger.warning("cannot forward %s to the leader at %s: %s", self.what, self.target, exc)
            client.close()
            return
        self.track(upstream)
        if client.transport is None or client.transport.is_closing():
            upstream.close()  # the client left while we dialled
            return
        assert upstream.transport is not None
        if self.proxy_header:
            upstream.transport.write(_header_of(client.transport))
        if client.early:
            upstream.transport.write(bytes(client.early))
            client.early.clear()
        client.transport.resume_reading()

    async def close(self) -> None:
        """Stop listening and close every piped connection, both sides."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connecting):
            task.cancel()
        for pipe in list(self._pipes):
            pipe.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


def _header_of(transport: asyncio.Transport) -> bytes:
    peer = transport.get_extra_info("peername")
    local = transport.get_extra_info("sockname")
    if not isinstance(peer, tuple) or not isinstance(local, tuple):
        return b"PROXY UNKNOWN\r\n"
    return proxy_v1_header((peer[0], peer[1]), (local[0], local[1]))
