"""A loopback TCP to WebSocket relay, so that TCP AMQP clients (pika) run unchanged over
the broker's AMQP-over-WebSocket endpoint: each TCP connection accepted on `port` opens
a WebSocket (subprotocol amqp) to `url`; every TCP read goes as one binary message, every
message comes back as TCP bytes. It runs on its own event-loop thread; `close()` stops it
and every connection it opened."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import aiohttp

READ_BYTES_MAX = 64 * 1024  # one TCP read, one WebSocket message
START_TIMEOUT_S = 10


class WebSocketRelay:
    def __init__(self, url: str) -> None:
        self.url = url
        self.port = 0
        self.connections = 0  # WebSockets opened so far
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        assert ready.wait(START_TIMEOUT_S), "relay did not start"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]

        self._loop.run_until_complete(start())
        ready.set()
        self._loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(self.url, protocols=("amqp",), autoping=True) as ws,
            ):
                self.connections += 1
                await _pump(reader, writer, ws)
        except asyncio.CancelledError:
            pass  # close(): this connection ends with the relay
        finally:
            self._tasks.discard(task)
            writer.close()

    def close(self) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(START_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_TIMEOUT_S)
        self._loop.close()


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    ws: aiohttp.ClientWebSocketResponse,
) -> None:
    """Copy both ways until either side closes; then close both."""

    async def tcp_to_ws() -> None:
        while data := await reader.read(READ_BYTES_MAX):
            await ws.send_bytes(data)
        await ws.close()

    async def ws_to_tcp() -> None:
        async for msg in ws:
            if msg.type is not aiohttp.WSMsgType.BINARY:
                break
            writer.write(msg.data)
            await writer.drain()
        writer.close()

    tasks = [asyncio.ensure_future(tcp_to_ws()), asyncio.ensure_future(ws_to_tcp())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
