"""The broker's listeners: each protocol's server socket, bound before it accepts.

Owns how `streamq serve` binds AMQP (TCP, TLS, unix socket), HTTP and HTTPS (the
management API with AMQP and MQTT over WebSocket), the stream protocol (plain, TLS) and
MQTT (TCP, TLS, unix socket): every function binds without accepting (`start_serving=False`), and
`open_together` starts them all within one turn of the event loop, the AMQP port last
(the readiness rule of `streamq.app`). A port that cannot be bound is a ServeError naming
the protocol, the address and the reason.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import TYPE_CHECKING, cast

from amqp_gateway.gateway import Gateway
from amqp_gateway.listeners import (
    start_unix_listener,
)
from amqp_gateway.tuning import AmqpTuning
from amqp_gateway.websocket import AmqpOverWebSocket
from mqtt_gateway.server import (
    MqttGateway,
    start_mqtt_listener,
    start_mqtt_unix_listener,
)
from mqtt_gateway.websocket import MqttOverWebSocket
from stream_gateway.server import (
    StreamGateway,
    start_stream_listener,
)
from streamq.broker.broker import Broker
from streamq.tls import TlsContexts, TlsError, serve_tls

if TYPE_CHECKING:
    from http_gateway.server import HttpServer

from streamq.serve_config import ServeConfig, ServeError
from streamq.unix_socket import UnixListener


async def listen(
    start: Callable[[], Awaitable[asyncio.Server]], host: str, port: int, what: str
) -> asyncio.Server:
    try:
        return await start()
    except OSError as exc:
        raise ServeError(f"cannot listen for {what} on {host}:{port}: {exc.strerror}") from exc


async def listen_http(
    broker: Broker,
    host: str,
    port: int,
    websocket: AmqpOverWebSocket,
    tls: TlsContexts | None = None,
    mqtt_websocket: MqttOverWebSocket | None = None,
) -> HttpServer:
    """The management API (and AMQP and MQTT over WebSocket) on plain HTTP, or on HTTPS
    with `tls`: bound, accepting once `open_together` opens it."""
    server = await import_http()
    what = "HTTP" if tls is None else "HTTPS"
    try:
        if tls is None:
            started = await server.start_http_server(
                broker,
                host,
                port,
                websocket=websocket,
                mqtt_websocket=mqtt_websocket,
                start_serving=False,
            )
        else:
            listen = tls_listen(tls, what)
            started = await server.start_http_server(
                broker, host, port, listen, websocket=websocket, mqtt_websocket=mqtt_websocket
            )
        return cast("HttpServer", started)
    except OSError as exc:
        raise ServeError(f"cannot listen for {what} on {host}:{port}: {exc.strerror}") from exc


def import_http() -> asyncio.Future[ModuleType]:
    """The management gateway (aiohttp and its handlers, about half of the start-up's
    imports), imported on a worker thread: started before the broker's recovery, it
    loads meanwhile, and every listener opens together after both."""
    loop = asyncio.get_running_loop()
    return loop.run_in_executor(None, importlib.import_module, "http_gateway.server")


def tls_listen(
    tls: TlsContexts, what: str
) -> Callable[[Callable[[], asyncio.BaseProtocol], str, int], Awaitable[asyncio.Server]]:
    # The https context is read at each accept: a SIGHUP reload swaps it.
    return lambda factory, host, port: serve_tls(
        factory, host, port, lambda: tls.https, what, start_serving=False
    )


async def open_together(servers: list[asyncio.Server], last: asyncio.Server) -> None:
    """Start accepting on every bound listener, `last` (the AMQP port) after the others:
    a client that reaches the AMQP port finds the HTTP API, and every other port, open.
    Nothing is awaited between two listen() calls (uvloop's start_serving does not
    yield), so they open within one turn of the event loop."""
    for server in [*(s for s in servers if s is not last), last]:
        await server.start_serving()


def tls_contexts(config: ServeConfig) -> TlsContexts | None:
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


async def listen_amqps(gateway: Gateway, tls: TlsContexts, host: str, port: int) -> asyncio.Server:
    # The amqps context is read at each accept: a SIGHUP reload swaps it.
    return await listen(
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


async def listen_unix(gateway: Gateway, config: ServeConfig) -> UnixListener:
    path = config.amqp_unix_path
    try:
        return await start_unix_listener(
            gateway, path, config.unix_proxy_protocol, start_serving=False
        )
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ServeError(f"cannot listen for AMQP on unix socket {path!r}: {reason}") from exc


def stream_gateway(broker: Broker, config: ServeConfig) -> StreamGateway:
    return StreamGateway(
        broker,
        frame_max=config.stream_frame_max,
        heartbeat_s=config.stream_heartbeat_s,
        advertised_host=config.stream_advertised_host,
        advertised_port=config.stream_advertised_port,
    )


async def listen_streams(
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
        plain = await listen(
            lambda: start_stream_listener(streams, host, config.stream_port, start_serving=False),
            host,
            config.stream_port,
            "the stream protocol",
        )
        servers.append(plain)
        listeners.append(("stream", host, bound_port(plain)))
    if tls is not None and config.streams_port >= 0:
        secure = await listen(
            lambda: serve_streams_tls(streams, tls, host, config.streams_port),
            host,
            config.streams_port,
            "the stream protocol over TLS",
        )
        servers.append(secure)
        listeners.append(("stream/ssl", host, bound_port(secure)))
    return listeners


async def serve_streams_tls(
    streams: StreamGateway, tls: TlsContexts, host: str, port: int
) -> asyncio.Server:
    # The AMQPS context (client certificates when tls_verify_peer), read at each accept:
    # a SIGHUP reload swaps it.
    streams.attach(asyncio.get_running_loop())
    return await serve_tls(
        streams.protocol_factory, host, port, lambda: tls.amqps, "STREAMS", start_serving=False
    )


async def listen_mqtt(
    mqtt: MqttGateway,
    config: ServeConfig,
    servers: list[asyncio.Server],
    unix: list[UnixListener],
    tls: TlsContexts | None,
    trusted_proxy: Callable[[str], bool] | None = None,
) -> list[tuple[str, str, int]]:
    """The MQTT listeners (TCP, TLS, unix socket); their entries for `broker.listeners`,
    with RabbitMQ's protocol names. `trusted_proxy`: a cluster leader's followers, whose
    PROXY headers the TCP listener reads."""
    listeners = []
    host = config.bind if config.mqtt_bind is None else config.mqtt_bind
    mqtt.attach(asyncio.get_running_loop())  # the resource alarms, for every listener
    if config.mqtt_port >= 0:
        plain = await listen(
            lambda: start_mqtt_listener(
                mqtt,
                host,
                config.mqtt_port,
                config.tcp_proxy_protocol,
                trusted_proxy,
                start_serving=False,
            ),
            host,
            config.mqtt_port,
            "MQTT",
        )
        servers.append(plain)
        listeners.append(("mqtt", host, bound_port(plain)))
    if tls is not None and config.mqtts_port >= 0:
        contexts = tls
        # The AMQPS context (client certificates when tls_verify_peer), read at each
        # accept: a SIGHUP reload swaps it.
        secure = await listen(
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
        listeners.append(("mqtt/ssl", host, bound_port(secure)))
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


def bound_port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])
