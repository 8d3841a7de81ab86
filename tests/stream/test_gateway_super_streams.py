"""Super streams (HTTP API and protocol) and single active consumer, over raw sockets.

The management API's super-stream endpoint and the protocol's CreateSuperStream build
RabbitMQ 3.13's layout, which Partitions and Route read back; single active consumer
groups hand the active role over with ConsumerUpdate, and nothing is delivered to the
active one before it answered with its offset specification.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import Key, OffsetType, ResponseCode
from tests.integration.conftest import RunningBroker
from tests.stream.test_gateway_protocol import RawClient

OK = ResponseCode.OK
SAC = {"single-active-consumer": "true", "name": "group"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    running = RunningBroker(tmp_path / "data", stream_port=0)
    try:
        yield running
    finally:
        running.stop()


def connect(broker: RunningBroker) -> RawClient:
    client = RawClient(broker.stream_port)
    client.login()
    return client


def test_super_streams_over_http_and_the_protocol(broker: RunningBroker) -> None:
    path = "/api/stream/super-streams/%2F/orders"
    assert broker.http("PUT", path, {"partitions": 3, "arguments": {"max-age": "1h"}})[0] == 201
    assert broker.http("PUT", path, {"partitions": 3})[0] == 409
    assert broker.http("PUT", "/api/stream/super-streams/%2F/x", {"partitions": 0})[0] == 400
    status, shown, _ = broker.http("GET", path)
    assert status == 200 and shown == {
        "name": "orders",
        "vhost": "/",
        "partitions": ["orders-0", "orders-1", "orders-2"],
    }
    client = connect(broker)
    partitions = client.request(c.Partitions(1, "orders"))
    assert partitions == c.PartitionsResponse(1, OK, ("orders-0", "orders-1", "orders-2"))
    assert client.request(c.Route(2, "1", "orders")) == c.RouteResponse(2, OK, ("orders-1",))
    assert client.request(c.Route(3, "9", "orders")) == c.RouteResponse(3, OK, ())
    created = client.request(
        c.CreateSuperStream(4, "regions", ("regions-eu", "regions-us"), ("eu", "us"))
    )
    assert created == c.Response(Key.CREATE_SUPER_STREAM, 4, OK)
    route = client.request(c.Route(5, "us", "regions"))
    assert route == c.RouteResponse(5, OK, ("regions-us",))
    deleted = client.request(c.DeleteSuperStream(6, "regions"))
    assert deleted == c.Response(Key.DELETE_SUPER_STREAM, 6, OK)
    missing = ResponseCode.STREAM_DOES_NOT_EXIST
    assert client.request(c.Partitions(7, "regions")) == c.PartitionsResponse(7, missing, ())
    metadata = client.request(c.Metadata(8, ("regions-eu", "orders-2")))
    assert isinstance(metadata, c.MetadataResponse)
    assert [m.response_code for m in metadata.streams] == [missing, OK]
    assert broker.http("DELETE", path)[0] == 204
    assert broker.http("GET", "/api/queues/%2F/orders-0")[0] == 404
    client.close()


def subscribe(client: RawClient, stream: str, properties: dict[str, str]) -> c.ConsumerUpdate:
    spec = c.OffsetSpec(OffsetType.FIRST)
    answer = client.request(c.Subscribe(client.next_id(), 1, stream, spec, 10, properties))
    assert isinstance(answer, c.Response) and answer.response_code == OK
    update = client.read()
    assert isinstance(update, c.ConsumerUpdate)
    return update


def test_single_active_consumer_hands_over_when_the_active_one_leaves(
    broker: RunningBroker,
) -> None:
    first, second = connect(broker), connect(broker)
    first.request(c.Create(1, "s", {}))
    first.request(c.DeclarePublisher(2, 0, "", "s"))
    first.send(c.Publish(0, (c.PublishedMessage(1, b"a"),)))
    first.read_until(c.PublishConfirm)
    update = subscribe(first, "s", SAC)
    assert update.active
    assert update.subscription_id == 1
    inactive = subscribe(second, "s", SAC)
    assert not inactive.active
    # Nothing before the answer; then from where the answer says.
    first.send(c.ConsumerUpdateResponse(update.correlation_id, OK, c.OffsetSpec(OffsetType.FIRST)))
    assert isinstance(first.read(), c.Deliver)
    second.send(
        c.ConsumerUpdateResponse(inactive.correlation_id, OK, c.OffsetSpec(OffsetType.NONE))
    )
    first.request(c.Unsubscribe(first.next_id(), 1))
    taken = second.read()
    assert isinstance(taken, c.ConsumerUpdate) and taken.active
    second.send(c.ConsumerUpdateResponse(taken.correlation_id, OK, c.OffsetSpec(OffsetType.NONE)))
    deliver = second.read()  # NONE: from the Subscribe's own specification (first)
    assert isinstance(deliver, c.Deliver)
    first.close()
    second.close()


def test_a_super_streams_partitions_spread_over_its_consumers(broker: RunningBroker) -> None:
    """RabbitMQ's rule: the partition at index i is read by the member at i modulo the
    group's size, members in the order they joined."""
    assert broker.http("PUT", "/api/stream/super-streams/%2F/ss", {"partitions": 2})[0] == 201
    one, two = connect(broker), connect(broker)
    properties = {**SAC, "super-stream": "ss"}
    spec = c.OffsetSpec(OffsetType.FIRST)
    active: dict[tuple[str, int], bool] = {}

    def note(name: str, command: c.Command) -> None:
        if isinstance(command, c.ConsumerUpdate):
            active[(name, command.subscription_id)] = command.active

    for name, client in (("one", one), ("two", two)):
        # One client's subscriptions are in before the other's: the join order decides.
        for sub_id, stream in ((0, "ss-0"), (1, "ss-1")):
            client.send(c.Subscribe(client.next_id(), sub_id, stream, spec, 1, properties))
        answered = 0
        while answered < 2:
            command = client.read()
            answered += isinstance(command, c.Response)
            note(name, command)
    for name, client in (("one", one), ("two", two)):
        client.sock.settimeout(0.3)
        with contextlib.suppress(TimeoutError):
            while True:
                note(name, client.read())
    assert active == {("one", 0): True, ("one", 1): False, ("two", 0): False, ("two", 1): True}
    one.close()
    two.close()
