"""The broker process: data directory lock, listeners, signals and orderly shutdown.

Owns the life of a `streamq serve` process. It takes an exclusive lock on the data
directory (two brokers on one directory would corrupt it), binds the AMQP and HTTP
listeners, and stops on SIGTERM or SIGINT: it stops accepting, closes connections and
releases the lock. It must not parse protocol bytes itself.

The AMQP port is served by `amqp_gateway`, the HTTP port by `http_gateway` (the
management API), the stream port by `stream_gateway`, MQTT by `mqtt_gateway`; how each
is bound is `streamq.listening`, what the process runs with `streamq.serve_config`.

Readiness: every listener (AMQP, AMQPS, the unix socket, the stream ports, HTTP and
HTTPS with their WebSocket) is bound only after the broker has recovered its data
directory, and they start accepting together, the AMQP port last: a client that reaches
any port finds the whole node up. Under systemd (`Type=notify`) READY=1 follows
(streamq.sd_notify).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import uvloop

from amqp_gateway.gateway import Gateway
from amqp_gateway.listeners import (
    start_tcp_listener,
)
from amqp_gateway.websocket import AmqpOverWebSocket, message_bytes_max
from mqtt_gateway.server import (
    MqttGateway,
)
from mqtt_gateway.websocket import MqttOverWebSocket
from stream_gateway.server import (
    StreamGateway,
)
from streamq import listening
from streamq.broker.account_values import AccountsCorrupted
from streamq.broker.accounts import AccountValueInvalid, FirstUser
from streamq.broker.broker import Broker
from streamq.broker.definitions_import import Importer, read_definitions_file
from streamq.broker.errors import BrokerError
from streamq.broker.users import DEFAULT_PASSWORD, DEFAULT_USER, hash_password
from streamq.heap import RestTrim, tune_collector
from streamq.links.supervisor import LinkSupervisor
from streamq.log.versions import NewerFormat
from streamq.pidfile import PidfileError, remove_pidfile, write_pidfile
from streamq.proxy_receiver import TrustedProxy
from streamq.sd_notify import notifier
from streamq.serve_config import DataDirLocked, ServeConfig, ServeError
from streamq.tls import TlsContexts
from streamq.unix_socket import UnixListener

if TYPE_CHECKING:
    from http_gateway.server import HttpServer

# The names other modules import from here (ServeConfig and the errors live in serve_config).
__all__ = [
    "ClusterRole",
    "DataDirLocked",
    "ServeConfig",
    "ServeError",
    "first_user",
    "load_definitions",
    "lock_data_dir",
    "run_broker",
    "serve",
    "serving_status",
]

logger = logging.getLogger("streamq")

LOCK_FILE: Final = ".lock"


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


def first_user(config: ServeConfig) -> FirstUser | None:
    """The fresh data directory's user from `default_user` and its hash; None: guest/guest.

    Raises ServeError for a name or hash the accounts refuse."""
    if config.default_user == DEFAULT_USER and not config.default_password_hash:
        return None
    try:
        return FirstUser(
            config.default_user,
            config.default_password_hash or hash_password(DEFAULT_PASSWORD),
        )
    except AccountValueInvalid as exc:
        raise ServeError(f"default_user {config.default_user!r}: {exc}") from exc


async def load_definitions(broker: Broker, path: str) -> None:
    """Import the definitions file at `path` (before the listeners open); durable on
    return. Raises ServeError naming the file and the reason."""
    try:
        await Importer(broker, read_definitions_file(path), None).run()
    except (BrokerError, OSError) as exc:
        raise ServeError(f"load_definitions {path}: {exc}") from exc
    logger.info("loaded definitions from %s", path)


def serving_status(broker: Broker) -> str:
    """The STATUS= line of a serving broker (systemctl status shows it)."""
    queues = sum(len(vhost.queues) for vhost in broker.vhosts.values())
    role = "" if broker.cluster is None else "cluster leader, "
    return (
        f"{role}serving {len(broker.clients)} connections, {queues} queues "
        f"in {len(broker.vhosts)} vhosts"
    )


@dataclass(frozen=True, slots=True)
class ClusterRole:
    """How a cluster node (streamq.cluster) runs the broker as leader: the data directory
    is already locked (the node holds the lock while it follows, too), the broker was
    promoted from a follower's mirror (`failover`), and the AMQP listener takes PROXY
    headers from the followers' addresses (`trusted_proxy`)."""

    trusted_proxy: TrustedProxy
    failover: bool = True


async def run_broker(
    config: ServeConfig,
    stop: asyncio.Event,
    on_ready: Callable[[int, int], None] | None = None,
    on_broker: Callable[[Broker], None] | None = None,
    on_tls: Callable[[TlsContexts], None] | None = None,
    cluster: ClusterRole | None = None,
) -> None:
    """Run until `stop` is set; `on_ready(amqp_port, http_port)` is called once listening
    (every listener opens at once, after the broker's recovery: `listening.open_together`),
    `on_tls` with the TLS contexts (for their reload) when a TLS port is on, `on_broker`
    with the broker before anything else sees it.

    Raises ServeError if the broker cannot start.
    """
    tuning = listening.amqp_tuning(config)
    tls = listening.tls_contexts(config)  # a bad certificate stops the start before anything opens
    if tls is not None and on_tls is not None:
        on_tls(tls)
    lock_fd = lock_data_dir(config.data_dir) if cluster is None else -1
    servers: list[asyncio.Server] = []
    http: HttpServer | None = None
    https_servers: list[HttpServer] = []
    broker: Broker | None = None
    gateway: Gateway | None = None
    unix: UnixListener | None = None
    links: LinkSupervisor | None = None
    streams: StreamGateway | None = None
    mqtt: MqttGateway | None = None
    mqtt_unix: list[UnixListener] = []
    http_import = listening.import_http()  # loads while the broker recovers
    try:
        if config.pidfile:
            try:
                write_pidfile(config.pidfile)
            except PidfileError as exc:
                raise ServeError(str(exc)) from exc
        open_broker = functools.partial(
            Broker,
            config.data_dir,
            config.limits,
            direct_io=config.direct_io,
            first_user=first_user(config),
            failover=cluster is not None and cluster.failover,
        )
        notifier().status(f"recovering {os.path.abspath(config.data_dir)}")
        try:
            if cluster is None:
                broker = open_broker()
            else:
                # A promoted leader's recovery may outlast its lease (millions of messages
                # restored): in a thread, the event loop goes on keeping the lease alive.
                broker = await asyncio.to_thread(open_broker)
        except (NewerFormat, AccountsCorrupted) as exc:  # docs/operations.md, upgrades
            raise ServeError(str(exc)) from None
        if on_broker is not None:
            on_broker(broker)
        gateway = Gateway(broker, config.consumer_timeout_ms, tuning)
        if config.load_definitions:
            await load_definitions(broker, config.load_definitions)
        http_bind = config.bind if config.http_bind is None else config.http_bind
        await http_import
        amqp = await listening.listen(
            lambda: start_tcp_listener(
                gateway,
                config.bind,
                config.amqp_port,
                config.tcp_proxy_protocol,
                None if cluster is None else cluster.trusted_proxy,
                start_serving=False,
            ),
            config.bind,
            config.amqp_port,
            "AMQP",
        )
        servers.append(amqp)
        listeners = [("amqp", config.bind, listening.bound_port(amqp))]
        # AMQP over WebSocket on the HTTP port, as LavinMQ (http_gateway/websocket_api.py).
        origins = frozenset(filter(None, config.websocket_allow_origins.split(",")))
        websocket = AmqpOverWebSocket(
            gateway.protocol_factory,
            message_bytes_max(config.max_message_size, config.frame_max),
            origins,
        )
        # MQTT over WebSocket on `/mqtt` of the same ports, whatever MQTT listeners are on.
        mqtt = MqttGateway(
            broker,
            max_inflight_messages=config.mqtt_max_inflight_messages,
            default_vhost=config.mqtt_default_vhost,
            packet_bytes_max=config.mqtt_max_packet_size,
            topic_alias_maximum=config.mqtt_topic_alias_maximum,
            ssl_cert_login=config.mqtt_ssl_cert_login,
        )
        mqtt.attach(asyncio.get_running_loop())
        mqtt_websocket = MqttOverWebSocket(mqtt, origins)
        http = await listening.listen_http(
            broker, http_bind, config.http_port, websocket, mqtt_websocket=mqtt_websocket
        )
        servers.append(http.server)
        listeners.append(("http", http_bind, listening.bound_port(http.server)))
        if config.amqp_unix_path:
            unix = await listening.listen_unix(gateway, config)
            listeners.append(("amqp", config.amqp_unix_path, 0))  # LavinMQ: amqp, by path
        if tls is not None and config.amqps_port >= 0:
            amqps = await listening.listen_amqps(gateway, tls, config.bind, config.amqps_port)
            servers.append(amqps)
            listeners.append(("amqp/ssl", config.bind, listening.bound_port(amqps)))
        if tls is not None and config.https_port >= 0:
            https = await listening.listen_http(
                broker, http_bind, config.https_port, websocket, tls, mqtt_websocket
            )
            https_servers.append(https)
            servers.append(https.server)
            listeners.append(("https", http_bind, listening.bound_port(https.server)))
        if config.stream_port >= 0 or (tls is not None and config.streams_port >= 0):
            streams = listening.stream_gateway(broker, config)
            listeners += await listening.listen_streams(streams, config, tls, servers)
        if config.mqtt_port >= 0 or config.mqtt_unix_path or config.mqtts_port >= 0:
            trusted = None if cluster is None else cluster.trusted_proxy
            listeners += await listening.listen_mqtt(mqtt, config, servers, mqtt_unix, tls, trusted)
        broker.listeners[:] = listeners
        if tls is not None:
            broker.tls_files = (config.tls_cert, config.tls_ca_cert)
        unix_servers = [unix.server] if unix is not None else []
        unix_servers += [listener.server for listener in mqtt_unix]
        await listening.open_together(servers + unix_servers, amqp)
        # Shovels and federation links start once this broker serves AMQP: an `amqp://`
        # URI (this broker) connects through the gateway directly.
        links = LinkSupervisor(broker, gateway.direct_connector(), listening.bound_port(amqp))
        links.start()
        logger.info(
            "listening %s data_dir=%s",
            " ".join(f"{name}={host}:{port}" for name, host, port in listeners),
            os.path.abspath(config.data_dir),
        )
        notifier().ready(serving_status(broker), functools.partial(serving_status, broker))
        if on_ready is not None:
            on_ready(listening.bound_port(amqp), listening.bound_port(http.server))
        await stop.wait()
        logger.info("shutting down")
    finally:
        notifier().serving_ended()
        for server in servers:
            server.close()
        if unix is not None:
            unix.close()
        if links is not None:
            # Before the gateway closes: the links' direct sessions end in order, and
            # what they had unacked goes back to its queues.
            await links.stop()
        if streams is not None:
            streams.close_all("broker shutdown")
        for listener in mqtt_unix:
            listener.close()
        if mqtt is not None:
            mqtt.close_all("broker shutdown")
        if gateway is not None:
            # Before the HTTP server closes: its WebSocket clients get the 320 too.
            gateway.stop()
            gateway.close_all("broker shutdown")
        for closing in ([http] if http is not None else []) + https_servers:
            await closing.close()
        if broker is not None:
            await broker.aclose()
        if config.pidfile:
            remove_pidfile(config.pidfile)
        if lock_fd >= 0:
            os.close(lock_fd)
    logger.info("stopped")


def _reload(tls: list[TlsContexts]) -> None:
    """SIGHUP: reload the TLS certificate and key (LavinMQ's reload). It never stops the
    broker, whose default action on SIGHUP would be to die."""
    if not tls:
        logger.info("SIGHUP: no TLS listener, nothing to reload")
        return
    tls[0].reload()


# What `serve` runs until `stop` is set: one broker, or a cluster node. The list gets the
# TLS contexts, for SIGHUP's reload.
Runner = Callable[[ServeConfig, asyncio.Event, list[TlsContexts]], Awaitable[None]]


def _one_broker(
    config: ServeConfig, stop: asyncio.Event, tls: list[TlsContexts]
) -> Awaitable[None]:
    return run_broker(config, stop, on_tls=tls.append)


def _stopping(stop: asyncio.Event) -> None:
    """SIGTERM or SIGINT: tell systemd (STOPPING=1), then stop."""
    if not stop.is_set():
        notifier().stopping()
    stop.set()


async def _main(config: ServeConfig, run: Runner) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _stopping, stop)
    tls: list[TlsContexts] = []
    loop.add_signal_handler(signal.SIGHUP, _reload, tls)
    rest_trim = RestTrim()  # freed memory back to the kernel at rest (heap.py)
    rest_trim.start()
    notifier().start()  # the watchdog's pings (under systemd with WatchdogSec)
    try:
        await run(config, stop, tls)
    finally:
        rest_trim.stop()
        await notifier().stop()


def serve(config: ServeConfig, run: Runner = _one_broker) -> None:
    """Run the broker (or what `run` runs) on uvloop until SIGTERM or SIGINT. Raises
    ServeError on start-up."""
    tune_collector()  # the broker process's collector setting (heap.py)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(_main(config, run))
