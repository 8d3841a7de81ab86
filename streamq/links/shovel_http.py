"""LavinMQ's HTTP shovel destination: a `dest-uri` of http:// or https:// POSTs each
message, and the source is acked only after a 2xx.

Owns `HttpDestination`: the POSTs, one at a time and in order, from a worker task, with
LavinMQ's request shape (src/lavinmq/shovel/shovel.cr, HTTPDestination#push): the body is
the message body; headers are `User-Agent: LavinMQ`, `X-Shovel: <name>`, `Content-Type`
from content_type, `X-Message-Id` from message_id and `X-<name>` for each message header;
the path is the URI's path, else the message's `uri_path` header, else "/". Credentials in
the URI go as basic auth. Any other status, or a failed request, ends the session with the
reason (the source then gets its unacked messages back, and the shovel reconnects after its
reconnect-delay). It must not touch the source.
"""

from __future__ import annotations

import asyncio
import collections
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Final

import aiohttp

from amqp_gateway.codec.properties import decode_properties
from amqp_gateway.errors import AMQPSyntaxError
from streamq.links.amqp.client import Delivery
from streamq.links.shovel_endpoints import DestinationError

CONNECT_TIMEOUT_S: Final = 10.0  # LavinMQ's connect_timeout
READ_TIMEOUT_S: Final = 30.0  # LavinMQ's read_timeout
USER_AGENT: Final = "LavinMQ"  # LavinMQ's; receivers written for it may check it


class HttpDestinationError(DestinationError):
    """The HTTP destination refused a message or could not be reached."""


def request_headers(name: str, properties_raw: bytes) -> tuple[dict[str, str], str | None]:
    """(LavinMQ's request headers for a message with these properties, its uri_path
    header if any)."""
    headers = {"User-Agent": USER_AGENT, "X-Shovel": name}
    try:
        properties = decode_properties(properties_raw)
    except AMQPSyntaxError:
        return headers, None
    if properties.content_type is not None:
        headers["Content-Type"] = properties.content_type
    if properties.message_id is not None:
        headers["X-Message-Id"] = properties.message_id
    uri_path = None
    for key, value in (properties.headers or {}).items():
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        headers[f"X-{key}"] = text.replace("\r", " ").replace("\n", " ")
        if key == "uri_path":
            uri_path = text
    return headers, uri_path


class HttpDestination:
    """POSTs forwarded messages in order; `on_confirm(n, True, True)` after the n-th 2xx."""

    def __init__(self, uri: str, name: str, on_confirm: Callable[[int, bool, bool], None]) -> None:
        parts = urllib.parse.urlsplit(uri)
        self.uri = uri
        self._name = name
        self._on_confirm = on_confirm
        self._base = urllib.parse.urlunsplit((parts.scheme, parts.hostname or "", "", "", ""))
        if parts.port is not None:
            self._base += f":{parts.port}"
        self._path = parts.path
        self._auth = (
            aiohttp.BasicAuth(
                urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
            )
            if parts.username
            else None
        )
        self._pending: collections.deque[Delivery] = collections.deque()
        self._wakeup = asyncio.Event()
        self._posted = 0
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
        self._session = aiohttp.ClientSession(timeout=timeout)
        self._worker = asyncio.get_running_loop().create_task(self._post_all())

    def forward(self, deliveries: Sequence[Delivery]) -> None:
        # Bounded by the source's prefetch count: no more are delivered until these are acked.
        self._pending.extend(deliveries)
        self._wakeup.set()

    async def writable(self) -> None:
        return None  # each POST is awaited: nothing piles up in a socket buffer

    async def _post_all(self) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._pending:
                    await self._post(self._pending[0])
                    self._pending.popleft()
                    self._posted += 1
                    self._on_confirm(self._posted, True, True)
        except HttpDestinationError as exc:
            if not self.closed.done():
                self.closed.set_exception(exc)
        except Exception as exc:  # a request aiohttp refuses to build: end, with why
            if not self.closed.done():
                self.closed.set_exception(HttpDestinationError(f"POST failed: {exc!r}"))

    async def _post(self, delivery: Delivery) -> None:
        headers, uri_path = request_headers(self._name, delivery.properties)
        path = self._path or uri_path or "/"
        try:
            async with self._session.post(
                self._base + path, data=delivery.body, headers=headers, auth=self._auth
            ) as response:
                await response.read()
                status = response.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            raise HttpDestinationError(f"POST {self._base}{path}: {reason}") from None
        if not 200 <= status < 300:
            raise HttpDestinationError(f"POST {self._base}{path}: HTTP {status}")

    async def close(self) -> None:
        self._worker.cancel()
        await asyncio.gather(self._worker, return_exceptions=True)
        await self._session.close()
        if not self.closed.done():
            self.closed.set_result(None)
