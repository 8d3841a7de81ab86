"""The broker and the helpers of the stream protocol's end-to-end tests: the real rstream
client from PyPI against our broker's stream listener, over loopback.

The broker runs in-process on its own event-loop thread (tests/integration/conftest.py);
rstream runs on the test's event loop, so the tests are async and never block on it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pika
import pytest
from rstream import (
    AMQPMessage,
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
)

from tests.integration.conftest import RunningBroker

HOST = "127.0.0.1"
TIMEOUT_S = 10
CREDENTIALS = {"username": "guest", "password": "guest"}
T = TypeVar("T")


def stream_port(broker: RunningBroker) -> int:
    """The port of the broker's stream listener (it listens on port 0: the OS picks)."""
    ports = [port for protocol, _, port in broker.listeners if protocol == "stream"]
    assert len(ports) == 1, f"one stream listener expected: {broker.listeners}"
    return ports[0]


def start_broker(data_dir: Path, **settings: object) -> RunningBroker:
    return RunningBroker(data_dir, stream_port=0, **settings)


@contextlib.contextmanager
def stream_broker_on(data_dir: Path, **settings: object) -> Iterator[RunningBroker]:
    """A broker with a stream listener on `data_dir` for the `with` block (a restart);
    `settings`: more ServeConfig fields."""
    running = start_broker(data_dir, **settings)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    with stream_broker_on(tmp_path / "data") as running:
        yield running


class Clients:
    """The rstream clients of a test, opened on demand and closed together at its end:
    rstream sleeps 0.2 s in each connection's close, so closing them one by one would
    cost most of the suite's time."""

    def __init__(self, broker: RunningBroker) -> None:
        self.broker = broker
        self.opened: list[Any] = []

    async def producer(self, **options: Any) -> Producer:
        return await self.start(Producer(HOST, stream_port(self.broker), **CREDENTIALS, **options))

    async def consumer(self, **options: Any) -> Consumer:
        return await self.start(Consumer(HOST, stream_port(self.broker), **CREDENTIALS, **options))

    async def start(self, client: T) -> T:
        """`client` (anything rstream with start and close) started and kept to close."""
        await client.start()  # type: ignore[attr-defined]
        self.opened.append(client)
        return client

    async def close(self) -> None:
        opened, self.opened = self.opened, []
        await asyncio.gather(*(client.close() for client in opened))


@pytest.fixture
async def clients(broker: RunningBroker) -> AsyncIterator[Clients]:
    opened = Clients(broker)
    yield opened
    await opened.close()


async def send_confirmed(
    sender: Producer,
    stream: str,
    messages: Sequence[AMQPMessage | bytes],
    publisher_name: str | None = None,
) -> list[ConfirmationStatus]:
    """Publish `messages` in one batch (Publish frames as rstream builds them) and wait
    for a confirmation of each: their statuses, in the order they came."""
    statuses: list[ConfirmationStatus] = []
    done = asyncio.Event()

    async def confirmed(status: ConfirmationStatus) -> None:
        statuses.append(status)
        if len(statuses) >= len(messages):
            done.set()

    await sender.send_batch(stream, list(messages), publisher_name, confirmed)
    await asyncio.wait_for(done.wait(), TIMEOUT_S)
    return statuses


class Received:
    """What a subscription delivered: (offset, message) in arrival order; `wait(n)`
    returns once at least n came, and fails after TIMEOUT_S."""

    def __init__(self) -> None:
        self.items: list[tuple[int, Any]] = []
        self.timestamps: list[int] = []  # of the chunk of each message, ms since the epoch
        self.subscriber_id = -1
        self._changed = asyncio.Event()

    async def __call__(self, message: Any, context: MessageContext) -> None:
        self.items.append((context.offset, message))
        self.timestamps.append(context.timestamp)
        self._changed.set()

    async def wait(self, count: int) -> list[tuple[int, Any]]:
        async def enough() -> None:
            while len(self.items) < count:
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(enough(), TIMEOUT_S)
        except TimeoutError:
            pytest.fail(f"{len(self.items)} of {count} messages came: {self.offsets()}")
        return self.items

    async def quiet(self, seconds: float = 0.2) -> list[tuple[int, Any]]:
        """Everything received once nothing more came for `seconds`."""
        while True:
            seen = len(self.items)
            await asyncio.sleep(seconds)
            if len(self.items) == seen:
                return self.items

    def offsets(self) -> list[int]:
        return [offset for offset, _ in self.items]

    def bodies(self) -> list[bytes]:
        return [body_of(message) for _, message in self.items]


def decode(data: bytes) -> AMQPMessage | bytes:
    """rstream's AMQP 1.0 decoder, or the bytes as they came for a message that is not
    AMQP 1.0 (rstream publishes raw bytes as they are)."""
    try:
        return amqp_decoder(data)
    except Exception:
        return data


def body_of(message: AMQPMessage | bytes) -> bytes:
    """The message's data: rstream's decoder gives one data section as bytes, several
    as a list of them."""
    if isinstance(message, bytes):
        return message
    body = message.body
    return b"".join(body) if isinstance(body, list) else bytes(body)


async def subscribe(
    reader: Consumer,
    stream: str,
    offset_type: OffsetType = OffsetType.FIRST,
    offset: int | None = None,
    **options: Any,
) -> Received:
    received = Received()
    spec = ConsumerOffsetSpecification(offset_type, offset)
    received.subscriber_id = await reader.subscribe(
        stream, received, decoder=decode, offset_specification=spec, **options
    )
    return received


def numbered(count: int, start: int = 0, **options: Any) -> list[AMQPMessage]:
    """AMQP 1.0 messages b"m<n>" with application property n, for n from `start`."""
    return [
        AMQPMessage(body=b"m%d" % n, application_properties={"n": n}, **options)
        for n in range(start, start + count)
    ]


def pika_channel(broker: RunningBroker) -> tuple[pika.BlockingConnection, Any]:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(HOST, broker.amqp_port, blocked_connection_timeout=TIMEOUT_S)
    )
    return connection, connection.channel()


async def in_thread(fn: Callable[[], Any]) -> Any:
    """Run a blocking client (pika) off the test's event loop, so rstream keeps running."""
    return await asyncio.to_thread(fn)
