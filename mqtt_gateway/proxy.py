"""PROXY protocol on the MQTT listeners: a load balancer's header before MQTT's bytes.

Owns `ProxyHeaderReceiver`, the protocol of a connection on a listener with PROXY
protocol on (LavinMQ's `tcp_proxy_protocol` and `unix_proxy_protocol`, which streamq
applies to the AMQP and the MQTT listeners alike): it reads the header (v1 or v2) within
CONNECT_TIMEOUT_S, then hands the transport to an `MqttSession` whose endpoints are the
header's addresses (the socket's own for v1 UNKNOWN and v2 LOCAL), with the bytes that
followed the header. A connection without a valid header is closed and logged. A
cluster leader's MQTT listener trusts PROXY headers from its followers' addresses only
(`trusted_proxy`, `OptionalProxyHeaderReceiver`, as the AMQP listener's): from them a
header may lead a connection, from anyone else a header is refused. The
header parser is the AMQP gateway's (pure, no AMQP in it: pyproject.toml's import
contract names this one exception).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from mqtt_gateway.session import CONNECT_TIMEOUT_S, Endpoints, MqttSession
from streamq.proxy_protocol import (
    V1_SIGNATURE,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    parse_header,
)

if TYPE_CHECKING:
    from mqtt_gateway.server import MqttGateway

logger = logging.getLogger(__name__)

OwnEndpoints = Callable[[asyncio.Transport], Endpoints | None]
TrustedProxy = Callable[[str], bool]  # is this peer IP address allowed to send a header?


def socket_endpoints(transport: asyncio.Transport) -> Endpoints | None:
    own = transport.get_extra_info("sockname")
    peer = transport.get_extra_info("peername")
    if isinstance(own, tuple) and isinstance(peer, tuple):
        return (str(peer[0]), int(peer[1]), str(own[0]), int(own[1]))
    return None


class ProxyHeaderReceiver(asyncio.Protocol):
    """A connection until its PROXY header is read; then its MQTT session's."""

    def __init__(self, gateway: MqttGateway, own_endpoints: OwnEndpoints) -> None:
        self._gateway = gateway
        self._own_endpoints = own_endpoints
        self._transport: asyncio.Transport | None = None
        self._data = bytearray()  # bounded: parse_header refuses what grows past a header
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(CONNECT_TIMEOUT_S, self._refuse, "no PROXY header in time")

    def data_received(self, data: bytes) -> None:
        self._data += data
        try:
            parsed = parse_header(self._data)
        except ProxyHeaderError as exc:
            self._refuse(str(exc))
            return
        if parsed is None:
            return
        header, size = parsed
        self._cancel_timer()
        transport = self._transport
        assert transport is not None
        session = MqttSession(self._gateway, self._endpoints(header, transport))
        transport.set_protocol(session)
        session.connection_made(transport)
        rest = bytes(self._data[size:])
        if rest:
            session.data_received(rest)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()

    def _endpoints(self, header: ProxyHeader, transport: asyncio.Transport) -> Endpoints | None:
        source, destination = header.source, header.destination
        if source is None or destination is None:
            return self._own_endpoints(transport)
        if header.family == "UNIX":
            # A client of the balancer's own unix socket: not ours to call local.
            return (source[0] or "unix-proxied", 0, destination[0], 0)
        return (source[0], source[1], destination[0], destination[1])

    def _refuse(self, reason: str) -> None:
        self._cancel_timer()
        transport = self._transport
        if transport is None:
            return
        ends = socket_endpoints(transport)
        peer = f"{ends[0]}:{ends[1]}" if ends is not None else "a unix socket client"
        logger.warning("closing MQTT connection from %s: %s", peer, reason)
        transport.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def starts_with_header(data: bytes | bytearray) -> bool | None:
    """Whether `data`, a connection's first bytes, begin a PROXY header (v1 or v2); None
    while they could still be either (an MQTT CONNECT starts with 0x10: one byte tells)."""
    for signature in (V1_SIGNATURE, V2_SIGNATURE):
        if data[: len(signature)] == signature[: len(data)]:
            return True if len(data) >= len(signature) else None
    return False


class OptionalProxyHeaderReceiver(ProxyHeaderReceiver):
    """A connection on a cluster leader's listener, where its followers (forwarding their
    clients) send a PROXY header first: from a trusted peer a header is read and gives
    the client's address, while plain MQTT starts a session at once; from any other peer
    a header is refused, so that no client can claim another's address."""

    def __init__(
        self, gateway: MqttGateway, own_endpoints: OwnEndpoints, trusted_proxy: TrustedProxy
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
            transport = self._transport
            ends = socket_endpoints(transport) if transport is not None else None
            if ends is None or not self._trusted_proxy(ends[0]):
                self._refuse("a PROXY protocol header from a peer that is not a follower")
                return
        super().data_received(data)

    def _start_plain(self, data: bytes) -> None:
        self._cancel_timer()
        transport = self._transport
        assert transport is not None
        session = MqttSession(self._gateway, self._own_endpoints(transport))
        transport.set_protocol(session)
        session.connection_made(transport)
        session.data_received(data)
