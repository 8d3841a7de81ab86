"""AMQP listeners: the sockets that accept connections for the gateway's sessions.

Owns opening the AMQP listeners: plain TCP and a unix socket. Each accepted connection
is handed to a session from `Gateway.protocol_factory`; the session code is the same for
every transport. It must not parse AMQP bytes nor hold broker state.
"""

from __future__ import annotations

import asyncio

from amqp_gateway.gateway import Gateway


async def start_tcp_listener(gateway: Gateway, host: str, port: int) -> asyncio.Server:
    """Listen for AMQP over TCP on host:port. Raises OSError if it cannot bind."""
    loop = asyncio.get_running_loop()
    gateway.attach(loop)
    return await loop.create_server(gateway.protocol_factory, host, port, reuse_address=True)
