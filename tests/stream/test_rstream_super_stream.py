"""Super streams with rstream: created over the stream protocol (CreateSuperStream) or
over the HTTP API (the super-stream endpoint, or the exchange, its partition streams and
their bindings one by one, as RabbitMQ lays them out), then written with
SuperStreamProducer (routing by hash through Partitions, by key through Route) and read
with SuperStreamConsumer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from rstream import (
    AMQPMessage,
    ConfirmationStatus,
    MessageContext,
    RouteType,
    SuperStreamConsumer,
    SuperStreamCreationOption,
    SuperStreamProducer,
)
from rstream.superstream import HashRoutingMurmurStrategy

from tests.integration.conftest import RunningBroker
from tests.stream.conftest import (
    CREDENTIALS,
    HOST,
    TIMEOUT_S,
    Clients,
    body_of,
    decode,
    stream_port,
)

PARTITIONS = 3


async def key_of(message: AMQPMessage) -> str:
    return str(message.application_properties["key"])  # the message as sent: str keys


def keyed(keys: list[str]) -> list[AMQPMessage]:
    return [
        AMQPMessage(body=b"%d %s" % (n, key.encode()), application_properties={"key": key})
        for n, key in enumerate(keys)
    ]


def super_producer(broker: RunningBroker, routing: RouteType, **options: Any) -> Any:
    return SuperStreamProducer(
        HOST, stream_port(broker), **CREDENTIALS, super_stream="orders",
        routing_extractor=key_of, routing=routing, **options,
    )  # fmt: skip


async def send_all(sender: SuperStreamProducer, messages: list[AMQPMessage]) -> None:
    """Send each message (rstream batches them) and wait until all are confirmed."""
    confirmed: list[ConfirmationStatus] = []

    async def on_confirm(status: ConfirmationStatus) -> None:
        confirmed.append(status)

    for message in messages:
        await sender.send(message, on_publish_confirm=on_confirm)

    async def all_confirmed() -> None:
        while len(confirmed) < len(messages):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(all_confirmed(), TIMEOUT_S)
    assert all(status.is_confirmed for status in confirmed)


async def read_partitions(clients: Clients, count: int) -> dict[str, list[bytes]]:
    """The bodies of each partition, read with a SuperStreamConsumer from first."""
    got: dict[str, list[bytes]] = {}
    done = asyncio.Event()

    async def on_message(message: Any, context: MessageContext) -> None:
        got.setdefault(context.stream, []).append(body_of(message))
        if sum(map(len, got.values())) >= count:
            done.set()

    port = stream_port(clients.broker)
    reader = SuperStreamConsumer(HOST, port, **CREDENTIALS, super_stream="orders")
    await clients.start(reader)
    await reader.subscribe(on_message, decoder=decode)
    await asyncio.wait_for(done.wait(), TIMEOUT_S)
    await asyncio.sleep(0.2)  # nothing more comes
    assert sum(map(len, got.values())) == count
    return got


async def expected_by_hash(messages: list[AMQPMessage]) -> dict[str, list[bytes]]:
    """Where rstream's murmur3 strategy sends each message, over partitions orders-0..2."""

    class Partitions:
        async def partitions(self) -> list[str]:
            return [f"orders-{n}" for n in range(PARTITIONS)]

    strategy = HashRoutingMurmurStrategy(key_of)
    want: dict[str, list[bytes]] = {}
    for message in messages:
        (partition,) = await strategy.route(message, Partitions())  # type: ignore[arg-type]
        want.setdefault(partition, []).append(body_of(message))
    return want


async def test_created_over_the_protocol_routed_by_hash(clients: Clients) -> None:
    messages = keyed([f"customer-{n % 17}" for n in range(120)])
    # rstream creates it on start (CreateSuperStream) before it asks for the partitions.
    creation = SuperStreamCreationOption(PARTITIONS)
    sender = await clients.start(
        super_producer(clients.broker, RouteType.Hash, super_stream_creation_option=creation)
    )
    await send_all(sender, messages)
    want = await expected_by_hash(messages)
    assert len(want) == PARTITIONS  # the keys spread over every partition
    assert await read_partitions(clients, 120) == want


async def test_created_over_the_protocol_routed_by_key(clients: Clients) -> None:
    creation = SuperStreamCreationOption(0, binding_keys=["eu", "us", "asia"])
    sender = await clients.start(
        super_producer(clients.broker, RouteType.Key, super_stream_creation_option=creation)
    )
    # rstream's key strategy keeps the first route it was given (a client bug): one key
    # per producer, and Route asked directly for the others.
    await send_all(sender, keyed(["us"] * 5))
    locator = await (await clients.producer()).default_client
    assert await locator.route("eu", "orders") == ["orders-eu"]
    assert await locator.route("asia", "orders") == ["orders-asia"]
    assert await read_partitions(clients, 5) == {"orders-us": [b"%d us" % n for n in range(5)]}
    partitions = await locator.partitions("orders")
    assert partitions == ["orders-eu", "orders-us", "orders-asia"]


def create_with_the_endpoint(broker: RunningBroker) -> None:
    """PUT /api/stream/super-streams/{vhost}/{name} (RabbitMQ 3.13's layout, made for us)."""
    body = {"partitions": PARTITIONS}
    assert broker.http("PUT", "/api/stream/super-streams/%2F/orders", body)[0] == 201
    status, shown, _ = broker.http("GET", "/api/stream/super-streams/%2F/orders")
    assert status == 200
    assert shown["partitions"] == [f"orders-{n}" for n in range(PARTITIONS)]  # type: ignore[index]


def create_piece_by_piece(broker: RunningBroker) -> None:
    """The super stream as RabbitMQ lays it out, with the plain endpoints: a direct
    exchange marked x-super-stream, one stream per partition, bound with its key and its
    order (what a management client of RabbitMQ 3.10 does)."""
    exchange = {"type": "direct", "durable": True, "arguments": {"x-super-stream": True}}
    assert broker.http("PUT", "/api/exchanges/%2F/orders", exchange)[0] in (201, 204)
    for n in range(PARTITIONS):
        queue = {"durable": True, "arguments": {"x-queue-type": "stream"}}
        assert broker.http("PUT", f"/api/queues/%2F/orders-{n}", queue)[0] in (201, 204)
        binding = {"routing_key": str(n), "arguments": {"x-stream-partition-order": n}}
        path = f"/api/bindings/%2F/e/orders/q/orders-{n}"
        assert broker.http("POST", path, binding)[0] == 201


@pytest.mark.parametrize("create", [create_with_the_endpoint, create_piece_by_piece])
async def test_created_over_the_http_api(
    clients: Clients, create: Callable[[RunningBroker], None]
) -> None:
    await asyncio.to_thread(create, clients.broker)
    messages = keyed([f"customer-{n}" for n in range(60)])
    sender = await clients.start(super_producer(clients.broker, RouteType.Hash))
    await send_all(sender, messages)
    assert await read_partitions(clients, 60) == await expected_by_hash(messages)
