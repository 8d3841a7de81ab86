"""The two ends of a client connection, as the broker shows and judges them.

Owns `Endpoints`: the client's address (the peer), the broker's (local), and whether the
client is on this host, which guest's loopback-only rule asks. A session reads them off
its socket (`socket_endpoints`), or a listener hands them over: the address a PROXY
protocol header names, or a unix socket's (LavinMQ treats a unix socket's clients as
local). Logs, the connection's name and the management API's peer_host and peer_port all
come from here. Nothing here reads or writes a socket.
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass
from typing import Protocol

UNIX_PEER_HOST = "unix"  # a unix socket's client has no address: the peer port numbers it


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where a connection comes from and where it arrives."""

    peer_host: str
    peer_port: int
    host: str
    port: int
    loopback: bool  # the client is on this host

    @property
    def peer(self) -> str:
        """ "host:port" of the client, for log lines."""
        return f"{self.peer_host}:{self.peer_port}"


def ip_endpoints(peer: tuple[str, int], local: tuple[str, int]) -> Endpoints:
    """Endpoints of an IP connection; loopback when the peer's address is, an IPv4
    loopback address mapped into IPv6 (a dual-stack listener's view) included, as
    RabbitMQ's rabbit_net:is_loopback has it."""
    try:
        address = ipaddress.ip_address(peer[0])
    except ValueError:
        loopback = False
    else:
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        loopback = address.is_loopback or (mapped is not None and mapped.is_loopback)
    return Endpoints(peer[0], peer[1], local[0], local[1], loopback)


def unix_endpoints(path: str, number: int) -> Endpoints:
    """Endpoints of the `number`th connection to the unix socket at `path`: the client
    is on this host (the socket file is), and the number keeps connection names apart."""
    return Endpoints(UNIX_PEER_HOST, number, path, 0, True)


class HasExtraInfo(Protocol):
    """A transport, or what stands for one (an upgraded WebSocket's socket)."""

    def get_extra_info(self, name: str, default: object = None) -> object: ...


def socket_endpoints(transport: asyncio.BaseTransport | HasExtraInfo) -> Endpoints | None:
    """The endpoints of an IP transport (TCP, TLS); None for any other."""
    peer = transport.get_extra_info("peername")
    local = transport.get_extra_info("sockname")
    if not isinstance(peer, tuple) or not isinstance(local, tuple):
        return None
    return ip_endpoints((peer[0], peer[1]), (local[0], local[1]))


def connection_name(endpoints: Endpoints | None, peer: str) -> str:
    """The connection's name in log lines, as the management API's (RabbitMQ's)."""
    if endpoints is None:
        return peer
    return f"{endpoints.peer} -> {endpoints.host}:{endpoints.port}"
