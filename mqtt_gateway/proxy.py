"""PROXY protocol on the MQTT listeners: a load balancer's header before MQTT's bytes.

Owns `MqttStarter`, the MQTT side of `streamq.proxy_receiver`'s receivers (LavinMQ's
`tcp_proxy_protocol` and `unix_proxy_protocol`, which streamq applies to the AMQP and the
MQTT listeners alike; and a cluster leader's listener, which trusts headers from its
followers only): the header must come within CONNECT_TIMEOUT_S, and the transport then
goes to an `MqttSession` whose endpoints are the header's addresses (the socket's own
for v1 UNKNOWN and v2 LOCAL), with the bytes that followed the header. And
`socket_endpoints`, a TCP connection's own endpoints.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from mqtt_gateway.session import CONNECT_TIMEOUT_S, Endpoints, MqttSession
from streamq.proxy_protocol import ProxyHeader

if TYPE_CHECKING:
    from mqtt_gateway.server import MqttGateway

OwnEndpoints = Callable[[asyncio.Transport], Endpoints | None]


def socket_endpoints(transport: asyncio.Transport) -> Endpoints | None:
    own = transport.get_extra_info("sockname")
    peer = transport.get_extra_info("peername")
    if isinstance(own, tuple) and isinstance(peer, tuple):
        return (str(peer[0]), int(peer[1]), str(own[0]), int(own[1]))
    return None


class MqttStarter:
    """The MQTT side of a PROXY protocol listener's receivers (module docstring)."""

    label = "MQTT"

    def __init__(self, gateway: MqttGateway, own_endpoints: OwnEndpoints) -> None:
        self._gateway = gateway
        self._own_endpoints = own_endpoints

    def header_timeout_s(self) -> float:
        return CONNECT_TIMEOUT_S

    def own_endpoints(self, transport: asyncio.Transport) -> Endpoints | None:
        return self._own_endpoints(transport)

    def header_endpoints(self, header: ProxyHeader, transport: asyncio.Transport) -> Endpoints:
        source, destination = header.source, header.destination
        assert source is not None and destination is not None
        if header.family == "UNIX":
            # A client of the balancer's own unix socket: not ours to call local.
            return (source[0] or "unix-proxied", 0, destination[0], 0)
        return (source[0], source[1], destination[0], destination[1])

    def start(self, transport: asyncio.Transport, endpoints: Endpoints | None, data: bytes) -> None:
        session = MqttSession(self._gateway, endpoints)
        transport.set_protocol(session)
        session.connection_made(transport)
        if data:
            session.data_received(data)
