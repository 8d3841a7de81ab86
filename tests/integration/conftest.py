"""The broker for integration tests: started in-process on loopback port 0, with its data
directory under the test's tmp_path, on its own event-loop thread (the clients block)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import pika
import pytest
import uvloop
from pika.adapters.blocking_connection import BlockingChannel

from streamq.app import ServeConfig, run_broker
from streamq.broker.broker import Broker
from streamq.broker.resources import ResourceLimits

START_TIMEOUT_S = 20
T = TypeVar("T")


class RunningBroker:
    def __init__(
        self, data_dir: Path, limits: ResourceLimits | None = None, **settings: object
    ) -> None:
        """`settings`: more ServeConfig fields (TLS, unix socket, tuning...); the broker's
        listeners are in `self.listeners` once it runs, as (protocol, host, port)."""
        self.data_dir = data_dir
        self.limits = limits
        # Never RabbitMQ's 5552 in tests: the stream listener is off unless a test asks
        # for it (stream_port=0: a port from the OS).
        settings.setdefault("stream_port", -1)
        settings.setdefault("mqtt_port", -1)  # nor 1883: tests/mqtt/conftest.py asks for one
        # The tests' clients dial 127.0.0.1; the default (the host name, as RabbitMQ)
        # need not resolve on a test machine, and rstream connects to what it names.
        settings.setdefault("stream_advertised_host", "127.0.0.1")
        self.settings = settings
        self.listeners: list[tuple[str, str, int]] = []
        self.broker: Broker | None = None  # for tests that change limits at run time
        self.amqp_port = 0
        self.http_port = 0
        self.stream_port = 0  # the plain stream listener's, once it runs (0: off)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="streamq-broker", daemon=True)
        self._thread.start()
        assert self._ready.wait(START_TIMEOUT_S), "broker did not start"
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(amqp_port: int, http_port: int) -> None:
                self.amqp_port = amqp_port
                self.http_port = http_port
                if self.broker is not None:
                    self.listeners = list(self.broker.listeners)
                    self.stream_port = next(
                        (p for name, _h, p in self.listeners if name == "stream"), 0
                    )
                self._ready.set()

            def keep(broker: Broker) -> None:
                self.broker = broker

            config = ServeConfig(
                str(self.data_dir),
                "127.0.0.1",
                0,
                0,
                self.limits,
                **self.settings,  # type: ignore[arg-type]
            )
            await run_broker(config, self._stop, ready, keep)

        try:
            uvloop.run(main())
        except BaseException as exc:
            self.error = exc
            self._ready.set()

    def http(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        user: str = "guest",
        password: str = "guest",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, object, http.client.HTTPResponse]:
        """One request to the HTTP port with basic auth: (status, the body parsed as JSON
        when it is JSON, else its text or None, the response). A bytes `body` goes as is,
        anything else as JSON."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=START_TIMEOUT_S)
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        sent = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
        sent.update(headers or {})
        payload = body if isinstance(body, bytes) else None if body is None else json.dumps(body)
        try:
            conn.request(method, path, payload, sent)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        parsed = (
            json.loads(data)
            if data and response.getheader("Content-Type", "").startswith("application/json")
            else (data.decode() if data else None)
        )
        return response.status, parsed, response

    def put_policy(self, name: str, body: dict[str, object]) -> int:
        """PUT /api/policies/%2F/{name} as guest; the HTTP status."""
        return self.http("PUT", f"/api/policies/%2F/{name}", body)[0]

    def call(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the broker's event loop (the broker is not thread-safe)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn)

    def ask(self, fn: Callable[[], T]) -> T:
        """`fn()` run on the broker's event loop, waited for: read broker state safely."""
        done = threading.Event()
        out: list[T] = []

        def run() -> None:
            out.append(fn())
            done.set()

        self.call(run)
        assert done.wait(START_TIMEOUT_S), "the broker's loop did not answer"
        return out[0]

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(START_TIMEOUT_S)
        assert not self._thread.is_alive(), "broker did not stop"


def publish_persistent(port: int, queue: str, bodies: Iterable[bytes]) -> None:
    """Declare durable `queue` and publish `bodies` to it persistent, under confirms."""
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=10)
    )
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    for body in bodies:
        channel.basic_publish("", queue, body, persistent)
    connection.close()


def drain_bodies(channel: BlockingChannel, queue: str) -> list[bytes]:
    """Every message in `queue` now, in order: basic.get with auto-ack until it is empty
    (what the same connection published before is routed by then)."""
    bodies = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def dead_letter_setup(
    channel: BlockingChannel, source: str, durable: bool = False, **arguments: object
) -> None:
    """A fanout exchange `dlx` bound to a queue `dead`, and the queue `source` declared
    with `arguments` (which name `dlx` as its dead-letter exchange where a test wants)."""
    channel.exchange_declare("dlx", "fanout", durable=durable)
    channel.queue_declare("dead", durable=durable)
    channel.queue_bind("dead", "dlx")
    channel.queue_declare(source, durable=durable, arguments=arguments)


def poll_messages(
    channel: BlockingChannel, queue: str, count: int, every_s: float = 0.01, timeout_s: float = 10
) -> list[tuple[float, pika.BasicProperties, bytes]]:
    """(arrival time, properties, body) of the next `count` messages of `queue`, taken
    with basic.get and auto-ack; while it is empty the connection processes events for
    `every_s`. Fails after `timeout_s` (for messages a timer releases: TTL, delays)."""
    got: list[tuple[float, pika.BasicProperties, bytes]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} in {queue}"
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            channel.connection.process_data_events(time_limit=every_s)
            continue
        got.append((time.monotonic(), properties, body))
    return got


@contextlib.contextmanager
def broker_on(data_dir: Path, limits: ResourceLimits | None = None) -> Iterator[RunningBroker]:
    """A broker on an existing data directory for the `with` block: the restart of one
    that a test stopped (or whose files it damaged)."""
    running = RunningBroker(data_dir, limits)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    running = RunningBroker(tmp_path / "data")
    yield running
    running.stop()


CLIENT_WAIT_S = 10

PikaConnect = Callable[..., pika.BlockingConnection]


def pika_on(broker: RunningBroker, **kwargs: object) -> pika.BlockingConnection:
    """A pika connection to `broker` as guest (pika.ConnectionParameters' `kwargs` beside
    the address), with bounded connect and blocked waits."""
    params = pika.ConnectionParameters(
        "127.0.0.1",
        broker.amqp_port,
        socket_timeout=CLIENT_WAIT_S,
        blocked_connection_timeout=CLIENT_WAIT_S,
        **kwargs,
    )
    return pika.BlockingConnection(params)


@pytest.fixture
def connection(broker: RunningBroker) -> Iterator[pika.BlockingConnection]:
    """A guest connection to the test's broker, closed after the test if still open."""
    conn = pika_on(broker)
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def channel(connection: pika.BlockingConnection) -> BlockingChannel:
    return connection.channel()


@pytest.fixture
def pika_connect(broker: RunningBroker) -> Iterator[PikaConnect]:
    """`connect(vhost="/", user="guest", password=None)`: a pika connection to `broker`
    (the password defaults to the user's name: guest's is guest), closed after the test
    if still open."""
    opened: list[pika.BlockingConnection] = []

    def connect(
        vhost: str = "/", user: str = "guest", password: str | None = None
    ) -> pika.BlockingConnection:
        params = pika.ConnectionParameters(
            "127.0.0.1",
            broker.amqp_port,
            vhost,
            pika.PlainCredentials(user, user if password is None else password),
            socket_timeout=CLIENT_WAIT_S,
            blocked_connection_timeout=CLIENT_WAIT_S,
        )
        conn = pika.BlockingConnection(params)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        if conn.is_open:
            conn.close()


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = CLIENT_WAIT_S) -> None:
    """Poll `check` every 20 ms until it is true; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
