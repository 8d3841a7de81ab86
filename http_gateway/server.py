"""The HTTP server of the management API: the only code here that touches sockets.

Owns one asyncio protocol per connection: it feeds bytes to `RequestReader`, answers
requests one at a time in order (handlers may await a sync round), checks HTTP basic
authentication against the broker's users (the loopback rule for `guest` included, as
RabbitMQ), and routes by path. Errors become RabbitMQ-style JSON bodies, never a crash.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, cast

from http_gateway import policies_api, segments_api
from http_gateway.protocol import HttpError, Request, RequestReader, Response, error
from streamq.broker.broker import Broker
from streamq.broker.errors import BrokerError
from streamq.broker.users import User, login_allowed

logger = logging.getLogger(__name__)

PENDING_REQUESTS_MAX: Final = 64  # pipelined requests held per connection


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated request: the broker and who asks."""

    broker: Broker
    user: User


Handler = Callable[[Caller, Request], Awaitable[Response]]


def route(request: Request) -> Handler | None:
    """The handler for a request path; None for 404."""
    segments = request.segments
    api = len(segments) >= 2 and segments[0] == "api"
    if api and segments[1] in ("policies", "operator-policies"):
        return policies_api.handle
    if api and segments[1] == "stream-files":  # the Spark source's remote reads
        return segments_api.handle
    return None


class HttpHandler(asyncio.Protocol):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._reader = RequestReader()
        self._transport: asyncio.Transport | None = None
        self._queue: asyncio.Queue[Request | None] = asyncio.Queue(PENDING_REQUESTS_MAX)
        self._task: asyncio.Task[None] | None = None
        self._loopback = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        try:
            self._loopback = ipaddress.ip_address(peer[0]).is_loopback
        except (ValueError, TypeError, IndexError):
            self._loopback = False
        self._task = asyncio.get_running_loop().create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        try:
            requests = self._reader.feed(data)
        except HttpError as exc:
            self._send(error(exc.status, exc.reason), keep_alive=False)
            return
        for request in requests:
            if self._queue.full():
                self._send(error(503, "too many pipelined requests"), keep_alive=False)
                return
            self._queue.put_nowait(request)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._task is not None:
            self._task.cancel()

    async def _serve(self) -> None:
        while self._transport is not None:
            request = await self._queue.get()
            if request is None:
                return
            response = await self._answer(request)
            self._send(response, keep_alive=request.keep_alive)

    async def _answer(self, request: Request) -> Response:
        handler = route(request)
        if handler is None:
            return error(404, "Not Found")
        user = self._authenticate(request)
        if user is None:
            response = error(401, "Not_Authorized")
            response.headers["WWW-Authenticate"] = 'Basic realm="streamq"'
            return response
        try:
            return await handler(Caller(self.broker, user), request)
        except HttpError as exc:
            return error(exc.status, exc.reason)
        except BrokerError as exc:
            return error(400, str(exc))
        except Exception:  # a bug in a handler: 500 for this request, never a crash
            logger.exception("internal error in %s %s", request.method, request.path)
            return error(500, "internal error, see the broker log")

    def _authenticate(self, request: Request) -> User | None:
        scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            username, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user = self.broker.accounts.authenticate(username, password)
        if user is None or not login_allowed(user.name, self._loopback):
            return None
        return user

    def _send(self, response: Response, *, keep_alive: bool) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(response.encode(keep_alive))
        if not keep_alive:
            transport.close()


async def start_http_server(broker: Broker, host: str, port: int) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: HttpHandler(broker), host, port, reuse_address=True)
