"""AMQP listeners: the sockets that accept connections for the gateway's sessions.

Owns opening the AMQP listeners (plain TCP and a unix socket) and what happens between a
connection's accept and its session: the endpoints a session is given (a unix socket's,
treated as loopback as LavinMQ does) and, on a listener with PROXY protocol on, reading
the header a load balancer sends first (`streamq.proxy_receiver.ProxyHeaderReceiver`,
with `AmqpStarter`), within a bounded time. A cluster leader's listener trusts PROXY
headers from its followers' addresses only (`trusted_proxy`,
`OptionalProxyHeaderReceiver`): from them a header may lead a connection, from anyone
else a header is refused.
Once the header is read the transport is handed to the session itself
(`transport.set_protocol`): the session reads from the socket as on any other listener,
fast path included. It must not parse AMQP bytes nor hold broker state.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Final

from amqp_gateway.endpoints import Endpoints, ip_endpoints, socket_endpoints, unix_endpoints
from amqp_gateway.gateway import Gateway
from amqp_gateway.session import HANDSHAKE_TIMEOUT_S, AmqpSession
from streamq.proxy_protocol import ProxyHeader
from streamq.proxy_receiver import ProxyHeaderReceiver, TrustedProxy, protocol_factory
from streamq.unix_socket import UnixListener, listen_unix

logger = logging.getLogger(__name__)

# A PROXY header must be complete this long after the accept: the handshake's own bound
# (RabbitMQ's handshake_timeout), which starts again once the session takes over.
PROXY_HEADER_TIMEOUT_S: Final = HANDSHAKE_TIMEOUT_S

OwnEndpoints = Callable[[asyncio.BaseTransport], Endpoints | None]


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

    starter = AmqpStarter(gateway, socket_endpoints)
    factory = protocol_factory(starter, proxy_protocol, trusted_proxy, gateway.protocol_factory)
    return await loop.create_server(
        factory, host, port, reuse_address=True, start_serving=start_serving
    )


async def start_unix_listener(
    gateway: Gateway, path: str, proxy_protocol: int = 0, *, start_serving: bool = True
) -> UnixListener:
    """Listen for AMQP on a unix socket at `path`, removing a socket file a dead broker
    left there (`start_serving`: as for `start_tcp_listener`). Raises OSError if `path`
    is something else than a socket, another process listens on it, or it cannot be
    bound."""
    loop = asyncio.get_running_loop()
    gateway.attach(loop)
    numbers = itertools.count(1)

    def own(transport: asyncio.BaseTransport) -> Endpoints:
        return unix_endpoints(path, next(numbers))

    def factory() -> asyncio.BaseProtocol:
        if proxy_protocol:
            return ProxyHeaderReceiver(AmqpStarter(gateway, own))
        return gateway.protocol_factory(unix_endpoints(path, next(numbers)))

    return await listen_unix(factory, path, start_serving=start_serving)


class AmqpStarter:
    """The AMQP side of a PROXY protocol listener's receivers (`streamq.proxy_receiver`):
    endpoints of `amqp_gateway.endpoints`, a session from the gateway's factory, fed as
    the session reads (`feed`)."""

    label = "AMQP"

    def __init__(self, gateway: Gateway, own_endpoints: OwnEndpoints) -> None:
        self._gateway = gateway
        self._own_endpoints = own_endpoints

    def header_timeout_s(self) -> float:
        return PROXY_HEADER_TIMEOUT_S

    def own_endpoints(self, transport: asyncio.Transport) -> Endpoints | None:
        return self._own_endpoints(transport)

    def header_endpoints(self, header: ProxyHeader, transport: asyncio.Transport) -> Endpoints:
        source, destination = header.source, header.destination
        assert source is not None and destination is not None
        if header.family == "UNIX":
            # A client of the balancer's own unix socket: not ours to call local.
            own = self._own_endpoints(transport)
            number = own.peer_port if own is not None else 0
            return Endpoints(source[0] or "unix", number, destination[0], 0, False)
        return ip_endpoints(source, destination)

    def start(self, transport: asyncio.Transport, endpoints: Endpoints | None, data: bytes) -> None:
        session = self._gateway.protocol_factory(endpoints)
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
