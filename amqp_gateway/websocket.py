"""AMQP over WebSocket: one AMQP session over each socket the HTTP gateway upgrades.

Owns `AmqpOverWebSocket`, what the HTTP gateway calls for each upgraded socket: one
session from `Gateway.protocol_factory()` per socket, run over the shared
`streamq.websocket_transport.WebSocketTransport` (which owns the inbox, backpressure and
write buffer limits), the same session code as over TCP; and `message_bytes_max`, the
bound on one incoming message. It must not parse AMQP.

A socket whose upgrade came from a browser page of another origin (`cross_origin`, the
HTTP gateway's judgement) is not local, whatever its peer address: guest's loopback-only
rule refuses it (docs/websocket.md, "Origins"). Which origins may upgrade at all
(`allowed_origins`) is the HTTP gateway's to enforce; this side only carries the setting.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Final

from amqp_gateway.endpoints import Endpoints, socket_endpoints
from streamq.websocket_transport import MessageSocket, WebSocketTransport

__all__ = ["AmqpOverWebSocket", "MessageSocket", "WebSocketTransport", "message_bytes_max"]

FRAME_HEADER_BYTES: Final = 8  # type, channel, size; frame-end octet
FRAME_MIN_BYTES: Final = 4096  # spec 4.2.3 frame-min-size


def message_bytes_max(max_message_size: int, frame_max: int) -> int:
    """The largest WebSocket message a client may send: one publish of the largest body
    the broker takes, with its method and header frames (each within frame_max) and a
    frame header per body frame. Browser clients (@cloudamqp/amqp-client) send a whole
    publish in one message; a TCP session holds as much when it assembles that body."""
    frame_max = max(frame_max, FRAME_MIN_BYTES)
    body_frames = max_message_size // (frame_max - FRAME_HEADER_BYTES) + 1
    return max_message_size + FRAME_HEADER_BYTES * body_frames + 2 * frame_max


class AmqpOverWebSocket:
    """What the HTTP gateway runs for each WebSocket upgraded to AMQP."""

    def __init__(
        self,
        protocol_factory: Callable[[Endpoints | None], asyncio.BufferedProtocol],
        message_bytes_max: int,
        allowed_origins: frozenset[str] = frozenset(),
    ) -> None:
        self._protocol_factory = protocol_factory
        self.message_bytes_max = message_bytes_max
        self.allowed_origins = allowed_origins  # canonical (streamq.web_origin); empty: any

    async def serve(self, socket: MessageSocket) -> None:
        """Run one AMQP connection over `socket` until either side closes it."""
        endpoints = socket_endpoints(socket)
        if endpoints is not None and socket.cross_origin:
            # A page of another site in a browser on this host is not a local client.
            endpoints = dataclasses.replace(endpoints, loopback=False)
        await WebSocketTransport(socket, self._protocol_factory(endpoints)).run()
