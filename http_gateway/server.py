"""The management HTTP server: aiohttp on the broker's event loop.

Owns the application: its routes (one module per family of RabbitMQ management paths,
each exporting `routes`, an `aiohttp.web.RouteTableDef`), the middleware that
authenticates every `/api/` request (`auth.py`) and turns errors into RabbitMQ-style JSON
bodies (never a crash: a bug in a handler is a 500 for that request, logged), and the
listening socket. Handlers run on the broker's loop, so they read broker state directly;
anything that blocks (file reads, fsync) goes to a worker thread or a sync round.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from http_gateway import (
    accounts_api,
    backup_api,
    bindings_api,
    connections_api,
    definitions_api,
    exchanges_api,
    health_api,
    limits_api,
    links_api,
    metrics_api,
    openapi_api,
    overview_api,
    parameters_api,
    policies_api,
    queues_api,
    segments_api,
    streams_api,
    super_streams_api,
    topic_permissions_api,
    ui,
    websocket_api,
)
from http_gateway.auth import FAILED_LOGINS_KEY, FailedLogins, authenticate
from http_gateway.context import BODY_BYTES_MAX, BROKER_KEY
from http_gateway.errors import HttpError, error_response
from http_gateway.listing import refuse_sample_ranges
from streamq.broker import errors as broker_errors
from streamq.broker.broker import Broker
from streamq.log.errors import OutOfSpace

logger = logging.getLogger(__name__)

ROUTE_MODULES: Final = (
    policies_api,
    segments_api,
    ui,
    queues_api,
    exchanges_api,
    bindings_api,
    connections_api,
    metrics_api,
    accounts_api,
    topic_permissions_api,
    overview_api,
    definitions_api,
    parameters_api,
    limits_api,
    links_api,
    streams_api,
    super_streams_api,
    openapi_api,
    health_api,
    backup_api,
)
# Paths a user without a management tag may read (the Spark source's remote reads).
ANY_USER_PREFIXES: Final = ("/api/stream-files/",)
# Domain errors and the status RabbitMQ's management API answers them with.
BROKER_ERROR_STATUS: Final[tuple[tuple[type[broker_errors.BrokerError], int], ...]] = (
    (broker_errors.NotFound, 404),
    (broker_errors.QueueUnavailable, 503),
    (broker_errors.AccessRefused, 403),
    (broker_errors.ResourceLocked, 405),
    (broker_errors.NotAllowed, 404),
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Binds host:port to connections made by a protocol factory (aiohttp's web.Server).
Listen = Callable[[web.Server, str, int], Awaitable[asyncio.Server]]


def status_of(exc: broker_errors.BrokerError) -> int:
    for kind, status in BROKER_ERROR_STATUS:
        if isinstance(exc, kind):
            return status
    return 400


@web.middleware
async def api_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        if request.path.startswith("/api/"):
            await authenticate(request, any_user=request.path.startswith(ANY_USER_PREFIXES))
            refuse_sample_ranges(request.query)
        return await handler(request)
    except HttpError as exc:
        return error_response(exc.status, exc.reason, exc.kind)
    except web.HTTPException as exc:  # the router's 404 and 405, aiohttp's 413
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason)
    except broker_errors.BrokerError as exc:
        return error_response(status_of(exc), str(exc))
    except OutOfSpace as exc:
        # A management write (accounts.json) found the disk full: the file and the
        # state are as before; the call can be repeated once there is room.
        logger.error("%s %s not stored: %s", request.method, request.path, exc)
        return error_response(503, f"not stored, nothing changed: {exc.strerror} (disk full)")
    except Exception:
        logger.exception("internal error in %s %s", request.method, request.path)
        return error_response(500, "internal error, see the broker log")


def build_app(
    broker: Broker,
    websocket: websocket_api.WebSocketServer | None = None,
    mqtt_websocket: websocket_api.WebSocketServer | None = None,
) -> web.Application:
    """The application; with `websocket`, AMQP over WebSocket on any path as well, and
    with `mqtt_websocket` MQTT over WebSocket (on `/mqtt`)."""
    middlewares = [api_middleware]
    if websocket is not None:
        middlewares.insert(0, websocket_api.middleware)  # upgrades skip HTTP auth: AMQP's own
    app = web.Application(middlewares=middlewares, client_max_size=BODY_BYTES_MAX)
    app[BROKER_KEY] = broker
    app[FAILED_LOGINS_KEY] = FailedLogins()
    for module in ROUTE_MODULES:
        app.add_routes(module.routes)
    if websocket is not None:
        websocket_api.install(app, websocket, mqtt_websocket)
    return app


class HttpServer:
    """The listening management server; `close()` stops it and its connections."""

    def __init__(self, runner: web.AppRunner, server: asyncio.Server) -> None:
        self.runner = runner
        self.server = server

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        self.server.close()
        await self.runner.cleanup()


async def _listen_tcp(
    factory: web.Server, host: str, port: int, *, start_serving: bool = True
) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        factory, host, port, reuse_address=True, start_serving=start_serving
    )


async def start_http_server(
    broker: Broker,
    host: str,
    port: int,
    listen: Listen | None = None,
    *,
    websocket: websocket_api.WebSocketServer | None = None,
    mqtt_websocket: websocket_api.WebSocketServer | None = None,
    start_serving: bool = True,
) -> HttpServer:
    """Listen on host:port (with `listen`: the broker's TLS for HTTPS; None: plain TCP,
    accepting at once or, `start_serving` False, after `server.start_serving()`); with
    `websocket`, WebSocket upgrades carry AMQP connections (websocket_api.py), and with
    `mqtt_websocket` MQTT ones. Raises
    OSError if the port cannot be bound."""
    if listen is None:
        listen = functools.partial(_listen_tcp, start_serving=start_serving)
    app = build_app(broker, websocket, mqtt_websocket)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    protocol_factory = runner.server
    assert protocol_factory is not None, "set up above"
    try:
        server = await listen(protocol_factory, host, port)
    except OSError:
        await runner.cleanup()
        raise
    return HttpServer(runner, server)
