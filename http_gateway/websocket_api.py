"""AMQP and MQTT over WebSocket on the management ports (HTTP and HTTPS), as LavinMQ
serves them.

Owns the upgrade: a request whose `Upgrade: websocket` is on the path `/mqtt`, or offers
a subprotocol `mqtt` (or 3.1's `mqttv3.1`) and not `amqp`, carries one MQTT connection
when the broker serves MQTT (RabbitMQ's rabbitmq_web_mqtt, LavinMQ); one on `/mqtt`
offering subprotocols but no MQTT one is refused with 400. Any other upgrade on any path
offering `amqp`, or offering none (LavinMQ's JavaScript client names none), carries one
AMQP connection. The reply names the subprotocol chosen when the client offered it. Every
other request goes on to the API and UI as before; an upgrade offering other subprotocols
only is refused with 400. Also owns the WebSocket side of the socket
(`AiohttpMessageSocket`): binary messages go to the session as they are; a text
message, a message over the limit or a broken frame closes the socket with its WebSocket
close code and a log line. And owns the origin check against cross-site WebSocket
hijacking (docs/websocket.md, "Origins"): an upgrade whose `Origin` header (a browser
page's) is not in the allowed origins is refused with 403 when that list is set; without
a list it is served, marked `cross_origin` unless it is the broker's own origin on a
loopback host, so that guest's loopback-only rule refuses it. It must not parse AMQP or
MQTT: the AMQP gateway's `AmqpOverWebSocket` and the MQTT gateway's `MqttOverWebSocket`
(wired by streamq/app.py; gateways do not import each other) run the sessions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

from aiohttp import WSCloseCode, WSMsgType, hdrs, web

from http_gateway.errors import error_response
from streamq import web_origin

logger = logging.getLogger(__name__)

AMQP_SUBPROTOCOL: Final = "amqp"
MQTT_SUBPROTOCOLS: Final = ("mqtt", "mqttv3.1")  # 3.1.1 and 5.0; 3.1 (MQTT.js, paho 3.1)
MQTT_PATH: Final = "/mqtt"
CLOSE_TIMEOUT_S: Final = 5.0  # a client's answer to our close frame, then the TCP close
SHUTDOWN_WAIT_S: Final = 2.0  # for sessions to send connection.close before 1001

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AiohttpMessageSocket:
    """An upgraded WebSocket as the gateways' `MessageSocket`
    (streamq/websocket_transport.py)."""

    def __init__(
        self, ws: web.WebSocketResponse, request: web.Request, cross_origin: bool, protocol: str
    ) -> None:
        self._ws = ws
        self.protocol = protocol  # "AMQP" or "MQTT", for log lines
        self._request = request
        self.peer = _peer(request)
        self.cross_origin = cross_origin

    async def receive(self) -> bytes | None:
        """The next binary message; None once closed, having closed it with its code if
        the client broke the rules (text, too large, bad framing)."""
        msg = await self._ws.receive()
        if msg.type is WSMsgType.BINARY:
            data: bytes = msg.data
            return data
        if msg.type is WSMsgType.TEXT:
            reason = f"{self.protocol} needs binary"
            logger.warning("WebSocket client %s sent a text message; %s", self.peer, reason)
            await self._ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=reason.encode())
        elif msg.type is WSMsgType.ERROR:
            logger.warning(
                "WebSocket client %s: %s; closed with code %s",
                self.peer,
                msg.data,
                self._ws.close_code,
            )
        return None  # CLOSE, CLOSING, CLOSED

    async def send(self, data: bytes) -> None:
        await self._ws.send_bytes(data)

    async def close(self, code: int = WSCloseCode.OK) -> None:
        await self._ws.close(code=code)

    def abort(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.abort()

    def get_extra_info(self, name: str, default: object = None) -> object:
        transport = self._request.transport
        return default if transport is None else transport.get_extra_info(name, default)


class WebSocketServer(Protocol):
    """A gateway's side: amqp_gateway.websocket.AmqpOverWebSocket,
    mqtt_gateway.websocket.MqttOverWebSocket."""

    @property
    def message_bytes_max(self) -> int: ...

    @property
    def allowed_origins(self) -> frozenset[str]: ...

    async def serve(self, socket: AiohttpMessageSocket) -> None: ...


SERVER_KEY: Final = web.AppKey("amqp_websocket_server", WebSocketServer)
MQTT_SERVER_KEY: Final = web.AppKey("mqtt_websocket_server", WebSocketServer)
OPEN_KEY: Final = web.AppKey("amqp_websockets", dict[AiohttpMessageSocket, asyncio.Event])


def install(
    app: web.Application, server: WebSocketServer, mqtt: WebSocketServer | None = None
) -> None:
    """Serve AMQP over WebSocket on `app`'s every site, and MQTT with `mqtt`; `middleware`
    must be its first."""
    app[SERVER_KEY] = server
    if mqtt is not None:
        app[MQTT_SERVER_KEY] = mqtt
    app[OPEN_KEY] = {}
    app.on_shutdown.append(_close_all)


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    # Every request pays this header lookup; the API and UI see no other change.
    if request.headers.get(hdrs.UPGRADE, "").strip().lower() != "websocket":
        return await handler(request)
    offered = _offered(request)
    mqtt_offered = any(name in MQTT_SUBPROTOCOLS for name in offered)
    if request.path == MQTT_PATH or (mqtt_offered and AMQP_SUBPROTOCOL not in offered):
        mqtt = request.app.get(MQTT_SERVER_KEY)
        if mqtt is None:
            return error_response(404, "MQTT over WebSocket is not served")
        if offered and not mqtt_offered:
            return _refuse_subprotocols(request, offered, "mqtt")
        return await _upgrade(request, mqtt, "MQTT", MQTT_SUBPROTOCOLS)
    if offered and AMQP_SUBPROTOCOL not in offered:
        return _refuse_subprotocols(request, offered, AMQP_SUBPROTOCOL)
    return await _upgrade(request, request.app[SERVER_KEY], "AMQP", (AMQP_SUBPROTOCOL,))


def _offered(request: web.Request) -> list[str]:
    headers = request.headers.getall(hdrs.SEC_WEBSOCKET_PROTOCOL, ())
    return [name.strip() for header in headers for name in header.split(",") if name.strip()]


def _refuse_subprotocols(request: web.Request, offered: list[str], wanted: str) -> web.Response:
    logger.warning(
        "WebSocket upgrade from %s to %s refused: subprotocols %s offered, only %r served",
        _peer(request),
        request.path,
        ", ".join(offered),
        wanted,
    )
    return error_response(400, f"WebSocket subprotocol {wanted!r} required")


async def _upgrade(
    request: web.Request, server: WebSocketServer, protocol: str, subprotocols: tuple[str, ...]
) -> web.StreamResponse:
    origin = request.headers.get(hdrs.ORIGIN)
    allowed = server.allowed_origins
    cross_origin = origin is not None and not _trusted(request, origin, allowed)
    if origin is not None and allowed and web_origin.canonical(origin) not in allowed:
        logger.warning(
            "WebSocket upgrade from %s refused: origin %r is not allowed", _peer(request), origin
        )
        return error_response(403, f"WebSocket origin {origin!r} not allowed")
    if cross_origin:  # says why a guest login from loopback will be refused
        logger.info("WebSocket client %s: page origin %r is not local", _peer(request), origin)
    ws = web.WebSocketResponse(
        protocols=subprotocols,
        compress=False,  # bodies are the client's to compress: no CPU per message here
        max_msg_size=server.message_bytes_max,
        timeout=CLOSE_TIMEOUT_S,
    )
    if not ws.can_prepare(request).ok:
        return error_response(400, "not a WebSocket upgrade (RFC 6455 section 4.1)")
    await ws.prepare(request)
    socket = AiohttpMessageSocket(ws, request, cross_origin, protocol)
    sockets = request.app[OPEN_KEY]
    sockets[socket] = done = asyncio.Event()
    try:
        await server.serve(socket)
    finally:
        del sockets[socket]
        done.set()
    return ws


def _trusted(request: web.Request, origin: str, allowed: frozenset[str]) -> bool:
    """Whether a browser page of `origin` may count as local: it is listed, or it is the
    broker's own origin (this request's scheme and Host) on a loopback host. A name that
    is not loopback is not trusted even when it is the Host: DNS rebinding can point a
    site's name at 127.0.0.1, and its pages would then be same-origin."""
    canonical = web_origin.canonical(origin)
    if canonical is None:
        return False  # "null" (a file:// page, a sandboxed frame) or nonsense
    if canonical in allowed:
        return True
    own = web_origin.own(request.scheme, request.host)
    return canonical == own and web_origin.is_loopback(canonical)


async def _close_all(app: web.Application) -> None:
    """At shutdown: give the sessions (closed by their gateways: AMQP's 320, MQTT 5.0's
    DISCONNECT 0x8B) a moment to finish, then close what is left with 1001 Going Away."""
    sockets = app[OPEN_KEY]
    if not sockets:
        return
    waits = [asyncio.ensure_future(done.wait()) for done in sockets.values()]
    _, pending = await asyncio.wait(waits, timeout=SHUTDOWN_WAIT_S)
    for wait in pending:
        wait.cancel()
    for socket in list(sockets):
        await socket.close(WSCloseCode.GOING_AWAY)


def _peer(request: web.Request) -> str:
    transport = request.transport
    peer = None if transport is None else transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
