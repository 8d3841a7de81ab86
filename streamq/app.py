"""The broker process: data directory lock, listeners, signals and orderly shutdown.

Owns the life of a `streamq serve` process. It takes an exclusive lock on the data
directory (two brokers on one directory would corrupt it), binds the AMQP and HTTP
listeners, and stops on SIGTERM or SIGINT: it stops accepting, closes connections and
releases the lock. It must not parse protocol bytes itself.

The AMQP port is served by `amqp_gateway`, the HTTP port by `http_gateway` (the
management API: policies so far).

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
import importlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Final, cast

import uvloop

from amqp_gateway.gateway import Gateway
from amqp_gateway.listeners import (
    TrustedProxy,
    UnixListener,
    start_tcp_listener,
    start_unix_listener,
)
from amqp_gateway.tuning import AmqpTuning
from amqp_gateway.websocket import AmqpOverWebSocket, message_bytes_max
from mqtt_gateway.server import (
    MqttGateway,
    MqttUnixListener,
    start_mqtt_listener,
    start_mqtt_unix_listener,
)
from stream_gateway.server import (
    StreamGateway,
    start_stream_listener,
)
from streamq.broker.account_values import AccountsCorrupted
from streamq.broker.accounts import AccountValueInvalid, FirstUser
from streamq.broker.broker import Broker
from streamq.broker.definitions_import import Importer, read_definitions_file
from streamq.broker.errors import BrokerError
from streamq.broker.queue_arguments import CONSUMER_TIMEOUT_MS_DEFAULT
from streamq.broker.resources import ResourceLimits
from streamq.broker.users import DEFAULT_PASSWORD, DEFAULT_USER, hash_password
from streamq.heap import RestTrim, tune_collector
from streamq.links.supervisor import LinkSupervisor
from streamq.log.versions import NewerFormat
from streamq.pidfile import PidfileError, remove_pidfile, write_pidfile
from streamq.sd_notify import notifier
from streamq.tls import TlsContexts, TlsError, serve_tls

if TYPE_CHECKING:
    from http_gateway.server import HttpServer

logger = logging.getLogger("streamq")

LOCK_FILE: Final = ".lock"


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """What `streamq serve` runs with. The command line, STREAMQ_<KEY> environment
    variables and the --config file fill it (streamq/config.py); tests build it directly."""

    data_dir: str = "./data"
    bind: str = "127.0.0.1"  # the AMQP listeners' address ([amqp] bind)
    amqp_port: int = 5672
    http_port: int = 15672
    limits: ResourceLimits | None = None  # None: RabbitMQ's defaults (see resources.py)
    consumer_timeout_ms: int = CONSUMER_TIMEOUT_MS_DEFAULT  # 0: no consumer timeout
    direct_io: bool = True  # segment writes past the page cache where the file system can
    http_bind: str | None = None  # the management listeners' address; None: `bind`
    # Web origins whose pages may open AMQP over WebSocket, canonical and comma-separated
    # (streamq.web_origin); "": any origin, guest only from the broker's own loopback one.
    websocket_allow_origins: str = ""
    # TLS (LavinMQ's names): a listener is off while its port is -1.
    amqps_port: int = -1
    https_port: int = -1
    tls_cert: str = ""  # PEM: the certificate, or a chain with it first
    tls_key: str = ""  # PEM private key; "": in the certificate file
    tls_ciphers: str = ""  # OpenSSL cipher list for TLS 1.2; "": OpenSSL's defaults
    tls_min_version: str = "1.2"  # "1.2" or "1.3"
    tls_verify_peer: bool = False  # ask for a client certificate, verified against ca_cert
    tls_ca_cert: str = ""
    # AMQP over a unix socket ("" : none), and PROXY protocol on the AMQP listeners
    # (0: off; 1 or 2: a PROXY header, v1 or v2, must lead each connection).
    # RabbitMQ's stream protocol (stream_gateway): a listener is off while its port is -1;
    # the TLS one uses the AMQPS certificate. The advertised address is what Metadata and
    # Open tell clients to connect to ("" / 0: the address the client connected to).
    stream_port: int = 5552
    streams_port: int = -1
    stream_frame_max: int = 1_048_576
    stream_heartbeat_s: int = 60
    stream_advertised_host: str = ""
    stream_advertised_port: int = 0
    amqp_unix_path: str = ""
    tcp_proxy_protocol: int = 0
    unix_proxy_protocol: int = 0
    # MQTT (mqtt_gateway; LavinMQ's [mqtt] keys): the listener is off while its port is -1.
    mqtt_bind: str | None = None  # None: `bind`
    mqtt_port: int = 1883
    mqtts_port: int = -1  # MQTT over TLS, with the AMQPS certificate
    mqtt_unix_path: str = ""
    mqtt_max_inflight_messages: int = 65535
    mqtt_default_vhost: str = "/"
    mqtt_max_packet_size: int = 1_048_576
    # What the AMQP connection tuning offers (connection.tune).
    heartbeat_s: int = 60
    frame_max: int = 131072
    channel_max: int = 2047
    max_message_size: int = 128 * 1024 * 1024
    # A fresh data directory's first user (guest/guest unless set); the hash is
    # RabbitMQ's format (base64 of salt and SHA-256), "" for the hash of "guest".
    default_user: str = "guest"
    default_password_hash: str = ""
    load_definitions: str = ""  # a definitions JSON imported at boot, before listening
    pidfile: str = ""
    # Clustering (streamq.cluster; LavinMQ's [clustering] keys): off unless `clustering`.
    clustering: bool = False
    clustering_bind: str = "127.0.0.1"
    clustering_port: int = 5679
    clustering_advertised_uri: str = ""  # "": tcp://<clustering_bind>:<clustering_port>
    # The replication link's mutual TLS (all three, or none: clear text).
    clustering_tls_cert: str = ""
    clustering_tls_key: str = ""
    clustering_tls_ca: str = ""
    clustering_etcd_endpoints: str = "localhost:2379"
    clustering_etcd_prefix: str = "streamq"
    clustering_lease_ttl_s: int = 10
    clustering_on_leader_elected: str = ""
    clustering_on_leader_lost: str = ""


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


async def _listen(
    start: Callable[[], Awaitable[asyncio.Server]], host: str, port: int, what: str
) -> asyncio.Server:
    try:
        return await start()
    except OSError as exc:
        raise ServeError(f"cannot listen for {what} on {host}:{port}: {exc.strerror}") from exc


async def _listen_http(
    broker: Broker,
    host: str,
    port: int,
    websocket: AmqpOverWebSocket,
    tls: TlsContexts | None = None,
) -> HttpServer:
    """The management API (and AMQP over WebSocket) on plain HTTP, or on HTTPS with
    `tls`: bound, accepting once `_open_together` opens it."""
    server = await _import_http()
    what = "HTTP" if tls is None else "HTTPS"
    try:
        if tls is None:
            started = await server.start_http_server(
                broker, host, port, websocket=websocket, start_serving=False
            )
        else:
            listen = _tls_listen(tls, what)
            started = await server.start_http_server(
                broker, host, port, listen, websocket=websocket
            )
        return cast("HttpServer", started)
    except OSError as exc:
        raise ServeError(f"cannot listen for {what} on {host}:{port}: {exc.strerror}") from exc


def _import_http() -> asyncio.Future[ModuleType]:
    """The management gateway (aiohttp and its handlers, about half of the start-up's
    imports), imported on a worker thread: started before the broker's recovery, it
    loads meanwhile, and every listener opens together after both."""
    loop = asyncio.get_running_loop()
    return loop.run_in_executor(None, importlib.import_module, "http_gateway.server")


def _tls_listen(
    tls: TlsContexts, what: str
) -> Callable[[Callable[[], asyncio.BaseProtocol], str, int], Awaitable[asyncio.Server]]:
    # The https context is read at each accept: a SIGHUP reload swaps it.
    return lambda factory, host, port: serve_tls(
        factory, host, port, lambda: tls.https, what, start_serving=False
    )


async def _open_together(servers: list[asyncio.Server], last: asyncio.Server) -> None:
    """Start accepting on every bound listener, `last` (the AMQP port) after the others:
    a client that reaches the AMQP port finds the HTTP API, and every other port, open.
    Nothing is awaited between two listen() calls (uvloop's start_serving does not
    yield), so they open within one turn of the event loop."""
    for server in [*(s for s in servers if s is not last), last]:
        await server.start_serving()


def _tls_contexts(config: ServeConfig) -> TlsContexts | None:
    """The TLS contexts when a TLS port is on. Raises ServeError for a bad TLS setting."""
    if (
        config.amqps_port < 0
        and config.https_port < 0
        and config.streams_port < 0
        and config.mqtts_port < 0
    ):
        return None
    try:
        return TlsContexts(config)
    except TlsError as exc:
        raise ServeError(f"TLS: {exc}") from None


async def _listen_amqps(gateway: Gateway, tls: TlsContexts, host: str, port: int) -> asyncio.Server:
    # The amqps context is read at each accept: a SIGHUP reload swaps it.
    return await _listen(
        lambda: serve_tls(
            gateway.protocol_factory, host, port, lambda: tls.amqps, "AMQPS", start_serving=False
        ),
        host,
        port,
        "AMQPS",
    )


def amqp_tuning(config: ServeConfig) -> AmqpTuning:
    """The AMQP connection tuning of `config`. Raises ServeError if a value is out of
    its range (AmqpTuning.check)."""
    tuning = AmqpTuning(
        heartbeat_s=config.heartbeat_s,
        frame_max=config.frame_max,
        channel_max=config.channel_max,
        message_bytes_max=config.max_message_size,
    )
    try:
        tuning.check()
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    return tuning


async def _listen_unix(gateway: Gateway, config: ServeConfig) -> UnixListener:
    path = config.amqp_unix_path
    try:
        return await start_unix_listener(
            gateway, path, config.unix_proxy_protocol, start_serving=False
        )
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ServeError(f"cannot listen for AMQP on unix socket {path!r}: {reason}") from exc


def _stream_gateway(broker: Broker, config: ServeConfig) -> StreamGateway:
    return StreamGateway(
        broker,
        frame_max=config.stream_frame_max,
        heartbeat_s=config.stream_heartbeat_s,
        advertised_host=config.stream_advertised_host,
        advertised_port=config.stream_advertised_port,
    )


async def _listen_streams(
    streams: StreamGateway,
    config: ServeConfig,
    tls: TlsContexts | None,
    servers: list[asyncio.Server],
) -> list[tuple[str, str, int]]:
    """The stream protocol's listeners (plain, TLS) on the AMQP address; their entries for
    `broker.listeners`, with RabbitMQ's protocol names."""
    listeners = []
    host = config.bind
    if config.stream_port >= 0:
        plain = await _listen(
            lambda: start_stream_listener(streams, host, config.stream_port, start_serving=False),
            host,
            config.stream_port,
            "the stream protocol",
        )
        servers.append(plain)
        listeners.append(("stream", host, _bound_port(plain)))
    if tls is not None and config.streams_port >= 0:
        secure = await _listen(
            lambda: _serve_streams_tls(streams, tls, host, config.streams_port),
            host,
            config.streams_port,
            "the stream protocol over TLS",
        )
        servers.append(secure)
        listeners.append(("stream/ssl", host, _bound_port(secure)))
    return listeners


async def _serve_streams_tls(
    streams: StreamGateway, tls: TlsContexts, host: str, port: int
) -> asyncio.Server:
    # The AMQPS context (client certificates when tls_verify_peer), read at each accept:
    # a SIGHUP reload swaps it.
    streams.attach(asyncio.get_running_loop())
    return await serve_tls(
        streams.protocol_factory, host, port, lambda: tls.amqps, "STREAMS", start_serving=False
    )


def serving_status(broker: Broker) -> str:
    """The STATUS= line of a serving broker (systemctl status shows it)."""
    queues = sum(len(vhost.queues) for vhost in broker.vhosts.values())
    role = "" if broker.cluster is None else "cluster leader, "
    return (
        f"{role}serving {len(broker.clients)} connections, {queues} queues "
        f"in {len(broker.vhosts)} vhosts"
    )


async def _listen_mqtt(
    mqtt: MqttGateway,
    config: ServeConfig,
    servers: list[asyncio.Server],
    unix: list[MqttUnixListener],
    tls: TlsContexts | None,
) -> list[tuple[str, str, int]]:
    """The MQTT listeners (TCP, TLS, unix socket); their entries for `broker.listeners`,
    with RabbitMQ's protocol names."""
    listeners = []
    host = config.bind if config.mqtt_bind is None else config.mqtt_bind
    mqtt.attach(asyncio.get_running_loop())  # the resource alarms, for every listener
    if config.mqtt_port >= 0:
        plain = await _listen(
            lambda: start_mqtt_listener(
                mqtt, host, config.mqtt_port, config.tcp_proxy_protocol, start_serving=False
            ),
            host,
            config.mqtt_port,
            "MQTT",
        )
        servers.append(plain)
        listeners.append(("mqtt", host, _bound_port(plain)))
    if tls is not None and config.mqtts_port >= 0:
        contexts = tls
        # The AMQPS context (client certificates when tls_verify_peer), read at each
        # accept: a SIGHUP reload swaps it.
        secure = await _listen(
            lambda: serve_tls(
                mqtt.protocol_factory,
                host,
                config.mqtts_port,
                lambda: contexts.amqps,
                "MQTTS",
                start_serving=False,
            ),
            host,
            config.mqtts_port,
            "MQTT over TLS",
        )
        servers.append(secure)
        listeners.append(("mqtt/ssl", host, _bound_port(secure)))
    if config.mqtt_unix_path:
        path = config.mqtt_unix_path
        try:
            unix.append(
                await start_mqtt_unix_listener(
                    mqtt, path, config.unix_proxy_protocol, start_serving=False
                )
            )
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ServeError(f"cannot listen for MQTT on unix socket {path!r}: {reason}") from exc
        listeners.append(("mqtt", path, 0))
    return listeners


def _bound_port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


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
    (every listener opens at once, after the broker's recovery: `_open_together`),
    `on_tls` with the TLS contexts (for their reload) when a TLS port is on, `on_broker`
    with the broker before anything else sees it.

    Raises ServeError if the broker cannot start.
    """
    tuning = amqp_tuning(config)
    tls = _tls_contexts(config)  # a bad certificate stops the start before anything opens
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
    mqtt_unix: list[MqttUnixListener] = []
    http_import = _import_http()  # loads while the broker recovers
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
        amqp = await _listen(
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
        listeners = [("amqp", config.bind, _bound_port(amqp))]
        # AMQP over WebSocket on the HTTP port, as LavinMQ (http_gateway/websocket_api.py).
        websocket = AmqpOverWebSocket(
            gateway.protocol_factory,
            message_bytes_max(config.max_message_size, config.frame_max),
            frozenset(filter(None, config.websocket_allow_origins.split(","))),
        )
        http = await _listen_http(broker, http_bind, config.http_port, websocket)
        servers.append(http.server)
        listeners.append(("http", http_bind, _bound_port(http.server)))
        if config.amqp_unix_path:
            unix = await _listen_unix(gateway, config)
            listeners.append(("amqp", config.amqp_unix_path, 0))  # LavinMQ: amqp, by path
        if tls is not None and config.amqps_port >= 0:
            amqps = await _listen_amqps(gateway, tls, config.bind, config.amqps_port)
            servers.append(amqps)
            listeners.append(("amqp/ssl", config.bind, _bound_port(amqps)))
        if tls is not None and config.https_port >= 0:
            https = await _listen_http(broker, http_bind, config.https_port, websocket, tls)
            https_servers.append(https)
            servers.append(https.server)
            listeners.append(("https", http_bind, _bound_port(https.server)))
        if config.stream_port >= 0 or (tls is not None and config.streams_port >= 0):
            streams = _stream_gateway(broker, config)
            listeners += await _listen_streams(streams, config, tls, servers)
        if config.mqtt_port >= 0 or config.mqtt_unix_path or config.mqtts_port >= 0:
            mqtt = MqttGateway(
                broker,
                max_inflight_messages=config.mqtt_max_inflight_messages,
                default_vhost=config.mqtt_default_vhost,
                packet_bytes_max=config.mqtt_max_packet_size,
            )
            listeners += await _listen_mqtt(mqtt, config, servers, mqtt_unix, tls)
        broker.listeners[:] = listeners
        if tls is not None:
            broker.tls_files = (config.tls_cert, config.tls_ca_cert)
        unix_servers = [unix.server] if unix is not None else []
        unix_servers += [listener.server for listener in mqtt_unix]
        await _open_together(servers + unix_servers, amqp)
        # Shovels and federation links start once this broker serves AMQP: an `amqp://`
        # URI (this broker) connects through the gateway directly.
        links = LinkSupervisor(broker, gateway.direct_connector(), _bound_port(amqp))
        links.start()
        logger.info(
            "listening %s data_dir=%s",
            " ".join(f"{name}={host}:{port}" for name, host, port in listeners),
            os.path.abspath(config.data_dir),
        )
        notifier().ready(serving_status(broker), functools.partial(serving_status, broker))
        if on_ready is not None:
            on_ready(_bound_port(amqp), _bound_port(http.server))
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
