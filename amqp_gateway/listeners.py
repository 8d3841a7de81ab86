"""AMQP listeners: the sockets that accept connections for the gateway's sessions.

Owns opening the AMQP listeners (plain TCP and a unix socket) and what happens between a
connection's accept and its session: the endpoints a session is given (a unix socket's,
treated as loopback as LavinMQ does) and, on a listener with PROXY protocol on, reading
the header a load balancer sends first (`ProxyHeaderReceiver`), within a bounded time. A
cluster leader's listener trusts PROXY headers from its followers' addresses only
(`trusted_proxy`, `OptionalProxyHeaderReceiver`): from them a header may lead a
connection, from anyone else a header is refused.
Once the header is read the transport is handed to the session itself
(`transport.set_protocol`): the session reads from the socket as on any other listener,
fast path included. It must not parse AMQP bytes nor hold broker state.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, cast

from amqp_gateway.endpoints import Endpoints, ip_endpoints, socket_endpoints, unix_endpoints
from amqp_gateway.gateway import Gateway
from amqp_gateway.session import HANDSHAKE_TIMEOUT_S, AmqpSession
from streamq.proxy_protocol import (
    V1_SIGNATURE,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    parse_header,
)
from streamq.unix_socket import remove_stale_socket

logger = logging.getLogger(__name__)

# A PROXY header must be complete this long after the accept: the handshake's own bound
# (RabbitMQ's handshake_timeout), which starts again once the session takes over.
PROXY_HEADER_TIMEOUT_S: Final = HANDSHAKE_TIMEOUT_S
UNIX_SOCKET_MODE: Final = 0o666  # as LavinMQ: any local user may connect, then log in

OwnEndpoints = Callable[[asyncio.BaseTransport], Endpoints | None]
TrustedProxy = Callable[[str], bool]  # is this peer IP address allowed to send a header?


async def start_tcp_listener(
    gateway: Gateway,
    host: str,
    port: int,
    proxy_protocol: int = 0,
    trusted_proxy: TrustedProxy | None = None,
    *,
    start_serving: bool = True,
) -> asyncio.Server:
    """Listen for AMQP over TCP on host:port; with `proxy_protocol` (1 or 2: either
    version's header is accepted) each connection must start with a PROXY header. With
    `trusted_proxy` instead, a connection from a peer it accepts may start with one, and
    a header from any other peer is refused. `start_serving` False: bound, but accepting
    only after `start_serving()` (the broker opens its listeners together). Raises
    OSError if it cannot bind."""
    loop = asyncio.get_running_loop()
    gateway.attach(loop)

    def factory() -> asyncio.BaseProtocol:
        if proxy_protocol:
            return ProxyHeaderReceiver(gateway, socket_endpoints)
        if trusted_proxy is not None:
            return OptionalProxyHeaderReceiver(gateway, socket_endpoints, trusted_proxy)
        return gateway.protocol_factory()

    return await loop.create_server(
        factory, host, port, reuse_address=True, start_serving=start_serving
    )


@dataclass(frozen=True, slots=True)
class UnixListener:
    """A listening unix socket and the inode of its file (removed at `close`)."""

    server: asyncio.Server
    path: str
    inode: int

    def close(self) -> None:
        """Stop listening and remove the socket file, unless another process has put
        its own there since."""
        self.server.close()
        try:
            if os.lstat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except OSError:
            pass  # gone already, or not ours to remove


async def start_unix_listener(
    gateway: Gateway, path: str, proxy_protocol: int = 0, *, start_serving: bool = True
) -> UnixListener:
    """Listen for AMQP on a unix socket at `path`, removing a socket file a dead broker
    left there (`start_serving`: as for `start_tcp_listener`). Raises OSError if `path`
    is something else than a socket, another process listens on it, or it cannot be
    bound."""
    loop = asyncio.get_running_loop()
    gateway.attach(loop)
    remove_stale_socket(path)
    numbers = itertools.count(1)

    def own(transport: asyncio.BaseTransport) -> Endpoints:
        return unix_endpoints(path, next(numbers))

    def factory() -> asyncio.BaseProtocol:
        if proxy_protocol:
            return ProxyHeaderReceiver(gateway, own)
        return gateway.protocol_factory(unix_endpoints(path, next(numbers)))

    server = await loop.create_unix_server(factory, path, start_serving=start_serving)
    os.chmod(path, UNIX_SOCKET_MODE)
    return UnixListener(server, path, os.lstat(path).st_ino)


class ProxyHeaderReceiver(asyncio.Protocol):
    """A connection on a PROXY protocol listener until its header is read: then a
    session takes the transport over, with the header's addresses as its endpoints (or
    the socket's own for v1 UNKNOWN and v2 LOCAL) and the bytes that followed the header
    in the same read. A connection without a valid header, or whose header is not
    complete within PROXY_HEADER_TIMEOUT_S, is closed with a log line."""

    def __init__(self, gateway: Gateway, own_endpoints: OwnEndpoints) -> None:
        self._gateway = gateway
        self._own_endpoints = own_endpoints
        self._transport: asyncio.Transport | None = None
        self._data = bytearray()  # bounded: parse_header refuses what grows past a header
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(PROXY_HEADER_TIMEOUT_S, self._stalled)

    def data_received(self, data: bytes) -> None:
        self._data += data
        try:
            parsed = parse_header(self._data)
        except ProxyHeaderError as exc:
            self._refuse(str(exc))
            return
        if parsed is not None:
            header, size = parsed
            self._cancel_timer()
            self._start_session(header, bytes(self._data[size:]))

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()

    def _start_session(self, header: ProxyHeader, rest: bytes) -> None:
        transport = self._transport
        assert transport is not None
        session = self._gateway.protocol_factory(self._endpoints(header, transport))
        transport.set_protocol(session)
        session.connection_made(transport)
        feed(session, rest)

    def _endpoints(self, header: ProxyHeader, transport: asyncio.Transport) -> Endpoints | None:
        source, destination = header.source, header.destination
        if source is None or destination is None:
            return self._own_endpoints(transport)
        if header.family == "UNIX":
            # A client of the balancer's own unix socket: not ours to call local.
            own = self._own_endpoints(transport)
            number = own.peer_port if own is not None else 0
            return Endpoints(source[0] or "unix", number, destination[0], 0, False)
        return ip_endpoints(source, destination)

    def _stalled(self) -> None:
        self._refuse(f"no complete PROXY protocol header within {PROXY_HEADER_TIMEOUT_S:g} s")

    def _refuse(self, reason: str) -> None:
        self._cancel_timer()
        transport = self._transport
        if transport is None:
            return
        ends = socket_endpoints(transport)
        peer = ends.peer if ends is not None else "a unix socket client"
        logger.warning("closing connection from %s: %s", peer, reason)
        transport.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def starts_with_header(data: bytes | bytearray) -> bool | None:
    """Whether `data`, a connection's first bytes, begin a PROXY header (v1 or v2); None
    while they could still be either that or something else (an AMQP protocol header)."""
    for signature in (V1_SIGNATURE, V2_SIGNATURE):
        if data[: len(signature)] == signature[: len(data)]:
            return True if len(data) >= len(signature) else None
    return False


class OptionalProxyHeaderReceiver(ProxyHeaderReceiver):
    """A connection on a listener where some peers (a cluster's followers, forwarding
    their clients) may send a PROXY header first: from a trusted peer a header is read
    and gives the client's address, while plain AMQP starts a session at once; from any
    other peer a header is refused, so that no client can claim another's address."""

    def __init__(
        self, gateway: Gateway, own_endpoints: OwnEndpoints, trusted_proxy: TrustedProxy
    ) -> None:
        super().__init__(gateway, own_endpoints)
        self._trusted_proxy = trusted_proxy
        self._header: bool | None = None  # None until the first bytes tell

    def data_received(self, data: bytes) -> None:
        if self._header is None:
            self._data += data
            self._header = starts_with_header(self._data)
            if self._header is None:
                return  # a few bytes that both could start with: bounded by the timer
            data = bytes(self._data)
            self._data.clear()
            if not self._header:
                self._start_plain(data)
                return
            if not self._is_trusted():
                self._refuse("a PROXY protocol header from a peer that is not a follower")
                return
        super().data_received(data)

    def _is_trusted(self) -> bool:
        transport = self._transport
        ends = socket_endpoints(transport) if transport is not None else None
        return ends is not None and self._trusted_proxy(ends.peer_host)

    def _start_plain(self, data: bytes) -> None:
        self._cancel_timer()
        transport = self._transport
        assert transport is not None
        session = self._gateway.protocol_factory(self._own_endpoints(transport))
        transport.set_protocol(session)
        session.connection_made(transport)
        feed(session, data)


def feed(session: AmqpSession, data: bytes) -> None:
    """Hand `data`, read before the session took the transport, to the session as if it
    had read it itself (asyncio's BufferedProtocol calls)."""
    view = memoryview(data)
    while view:
        buffer = session.get_buffer(len(view))
        size = min(len(buffer), len(view))
        buffer[:size] = view[:size]
        session.buffer_updated(size)
        view = view[size:]
