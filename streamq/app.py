"""The broker process: data directory lock, listeners, signals and orderly shutdown.

Owns the life of a `streamq serve` process. It takes an exclusive lock on the data
directory (two brokers on one directory would corrupt it), binds the AMQP and HTTP
listeners, and stops on SIGTERM or SIGINT: it stops accepting, closes connections and
releases the lock. It must not parse protocol bytes itself.

The AMQP port is served by `amqp_gateway`, the HTTP port by `http_gateway` (the
management API: policies so far).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, cast

import uvloop

from amqp_gateway.server import Gateway, start_amqp_server
from streamq.broker.broker import Broker
from streamq.broker.queue_arguments import CONSUMER_TIMEOUT_MS_DEFAULT
from streamq.broker.resources import ResourceLimits
from streamq.heap import tune_collector

if TYPE_CHECKING:
    from http_gateway.server import HttpServer

logger = logging.getLogger("streamq")

LOCK_FILE: Final = ".lock"


@dataclass(frozen=True, slots=True)
class ServeConfig:
    data_dir: str = "./data"
    bind: str = "127.0.0.1"
    amqp_port: int = 5672
    http_port: int = 15672
    limits: ResourceLimits | None = None  # None: RabbitMQ's defaults (see resources.py)
    consumer_timeout_ms: int = CONSUMER_TIMEOUT_MS_DEFAULT  # 0: no consumer timeout
    direct_io: bool = True  # segment writes past the page cache where the file system can


class ServeError(Exception):
    """An operating error that stops the broker from starting (bad directory, port taken)."""


class DataDirLocked(ServeError):
    """Another process holds the data directory."""


def lock_data_dir(data_dir: str) -> int:
    """Create the data directory if needed and take its exclusive lock; returns the lock fd.

    Raises DataDirLocked if another process holds it, ServeError if it cannot be created.
    """
    try:
        os.makedirs(data_dir, exist_ok=True)
        fd = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ServeError(f"cannot use data directory {data_dir!r}: {exc.strerror}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DataDirLocked(
            f"data directory {data_dir!r} is in use by another streamq process (pid {holder})"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


async def _listen(
    start: Callable[[], Awaitable[asyncio.Server]], host: str, port: int, what: str
) -> asyncio.Server:
    try:
        return await start()
    except OSError as exc:
        raise ServeError(f"cannot listen for {what} on {host}:{port}: {exc.strerror}") from exc


async def _listen_http(broker: Broker, host: str, port: int) -> HttpServer:
    # The management gateway (aiohttp and its handlers, about half of the start-up's
    # imports) is imported on a worker thread once the AMQP listener is up: a restart
    # serves AMQP clients while it loads.
    loop = asyncio.get_running_loop()
    server = await loop.run_in_executor(None, importlib.import_module, "http_gateway.server")
    try:
        return cast("HttpServer", await server.start_http_server(broker, host, port))
    except OSError as exc:
        raise ServeError(f"cannot listen for HTTP on {host}:{port}: {exc.strerror}") from exc


def _bound_port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


async def run_broker(
    config: ServeConfig,
    stop: asyncio.Event,
    on_ready: Callable[[int, int], None] | None = None,
    on_broker: Callable[[Broker], None] | None = None,
) -> None:
    """Run until `stop` is set; `on_ready(amqp_port, http_port)` is called once listening.

    Raises ServeError if the broker cannot start.
    """
    lock_fd = lock_data_dir(config.data_dir)
    servers: list[asyncio.Server] = []
    http: HttpServer | None = None
    broker: Broker | None = None
    gateway: Gateway | None = None
    try:
        broker = Broker(config.data_dir, config.limits, direct_io=config.direct_io)
        if on_broker is not None:
            on_broker(broker)
        gateway = Gateway(broker, config.consumer_timeout_ms)
        servers.append(
            await _listen(
                lambda: start_amqp_server(gateway, config.bind, config.amqp_port),
                config.bind,
                config.amqp_port,
                "AMQP",
            )
        )
        http = await _listen_http(broker, config.bind, config.http_port)
        servers.append(http.server)
        broker.listeners[:] = [
            ("amqp", config.bind, _bound_port(servers[0])),
            ("http", config.bind, _bound_port(servers[1])),
        ]
        logger.info(
            "listening amqp=%s:%d http=%s:%d data_dir=%s",
            config.bind,
            _bound_port(servers[0]),
            config.bind,
            _bound_port(servers[1]),
            os.path.abspath(config.data_dir),
        )
        if on_ready is not None:
            on_ready(_bound_port(servers[0]), _bound_port(servers[1]))
        await stop.wait()
        logger.info("shutting down")
    finally:
        for server in servers:
            server.close()
        if http is not None:
            await http.close()
        if gateway is not None:
            gateway.stop()
            gateway.close_all("broker shutdown")
        if broker is not None:
            await broker.aclose()
        os.close(lock_fd)
    logger.info("stopped")


async def _main(config: ServeConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await run_broker(config, stop)


def serve(config: ServeConfig) -> None:
    """Run the broker on uvloop until SIGTERM or SIGINT. Raises ServeError on start-up."""
    tune_collector()  # the broker process's collector setting (heap.py)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(_main(config))
