"""A connection on a PROXY protocol listener until its header is read, for any gateway.

Owns `ProxyHeaderReceiver`, the asyncio protocol of a connection on a listener with PROXY
protocol on (LavinMQ's `tcp_proxy_protocol` and `unix_proxy_protocol`): it reads the
header a load balancer sends first (v1 or v2, `streamq.proxy_protocol`) within the
gateway's bound, then hands the transport to the gateway's session, whose endpoints are
the header's addresses (the socket's own for v1 UNKNOWN and v2 LOCAL), with the bytes
that followed the header. A connection without a valid header, or whose header is not
complete in time, is closed with a log line. And `OptionalProxyHeaderReceiver`, for a
cluster leader's listener where the followers forwarding their clients send a header
first: from a trusted peer a header is read, plain protocol bytes start a session at
once, and from any other peer a header is refused, so that no client can claim
another's address.

What differs between gateways (their endpoints' type, their session, the bound, the
name in log lines) is a `SessionStarter`; this module knows no protocol but PROXY's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar, cast

from streamq.proxy_protocol import (
    V1_SIGNATURE,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    parse_header,
)

logger = logging.getLogger(__name__)

E = TypeVar("E")
TrustedProxy = Callable[[str], bool]  # is this peer IP address allowed to send a header?


class SessionStarter(Protocol[E]):
    """A gateway's side of the receivers: its endpoints and its session."""

    label: str  # the protocol in log lines: "AMQP", "MQTT"

    def header_timeout_s(self) -> float:
        """How long after the accept a header may take to complete."""

    def own_endpoints(self, transport: asyncio.Transport) -> E | None:
        """The endpoints of the socket itself (no header, or one that names none)."""

    def header_endpoints(self, header: ProxyHeader, transport: asyncio.Transport) -> E | None:
        """The endpoints a header with both addresses names."""

    def start(self, transport: asyncio.Transport, endpoints: E | None, data: bytes) -> None:
        """Give `transport` to a new session with `endpoints`, and feed it `data` (the
        bytes read after the header, or before any)."""


def starts_with_header(data: bytes | bytearray) -> bool | None:
    """Whether `data`, a connection's first bytes, begin a PROXY header (v1 or v2); None
    while they could still be either that or something else (a protocol's first bytes)."""
    for signature in (V1_SIGNATURE, V2_SIGNATURE):
        if data[: len(signature)] == signature[: len(data)]:
            return True if len(data) >= len(signature) else None
    return False


def peer_text(transport: asyncio.Transport) -> str:
    """The socket's peer as `host:port`, for log lines (a unix socket has none)."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return "a unix socket client"


class ProxyHeaderReceiver(asyncio.Protocol, Generic[E]):
    """A connection until its PROXY header is read; then its session's."""

    def __init__(self, starter: SessionStarter[E]) -> None:
        self._starter = starter
        self._transport: asyncio.Transport | None = None
        self._data = bytearray()  # bounded: parse_header refuses what grows past a header
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._starter.header_timeout_s(), self._stalled)

    def data_received(self, data: bytes) -> None:
        self._data += data
        try:
            parsed = parse_header(self._data)
        except ProxyHeaderError as exc:
            self._refuse(str(exc))
            return
        if parsed is not None:
            header, size = parsed
            self._start(header, bytes(self._data[size:]))

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()

    def _start(self, header: ProxyHeader | None, rest: bytes) -> None:
        self._cancel_timer()
        transport = self._transport
        assert transport is not None
        starter = self._starter
        if header is None or header.source is None or header.destination is None:
            endpoints = starter.own_endpoints(transport)
        else:
            endpoints = starter.header_endpoints(header, transport)
        starter.start(transport, endpoints, rest)

    def _stalled(self) -> None:
        bound = self._starter.header_timeout_s()
        self._refuse(f"no complete PROXY protocol header within {bound:g} s")

    def _refuse(self, reason: str) -> None:
        self._cancel_timer()
        transport = self._transport
        if transport is None:
            return
        label = self._starter.label
        logger.warning("closing %s connection from %s: %s", label, peer_text(transport), reason)
        transport.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class OptionalProxyHeaderReceiver(ProxyHeaderReceiver[E]):
    """A connection on a cluster leader's listener (module docstring): a header from a
    trusted peer, none from anyone."""

    def __init__(self, starter: SessionStarter[E], trusted_proxy: TrustedProxy) -> None:
        super().__init__(starter)
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
                self._start(None, data)
                return
            if not self._is_trusted():
                self._refuse("a PROXY protocol header from a peer that is not a follower")
                return
        super().data_received(data)

    def _is_trusted(self) -> bool:
        transport = self._transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        return isinstance(peer, tuple) and self._trusted_proxy(str(peer[0]))


def protocol_factory(
    starter: SessionStarter[E],
    proxy_protocol: int,
    trusted_proxy: TrustedProxy | None,
    plain: Callable[[], asyncio.BaseProtocol],
) -> Callable[[], asyncio.BaseProtocol]:
    """A TCP listener's protocol factory: with `proxy_protocol` (1 or 2) every connection
    starts with a header; with `trusted_proxy` a trusted peer's may; else `plain`'s
    sessions, which read the protocol at once."""
    if proxy_protocol:
        return lambda: ProxyHeaderReceiver(starter)
    if trusted_proxy is not None:
        return lambda: OptionalProxyHeaderReceiver(starter, trusted_proxy)
    return plain
