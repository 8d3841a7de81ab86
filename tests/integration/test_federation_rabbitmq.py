"""A real RabbitMQ as the upstream of a federated streamq exchange and queue: Debian's
rabbitmq-server on free loopback ports with its own data directory (no federation plugin
on it: the downstream does the work, as with RabbitMQ's own plugin against a plain
upstream). The link declares RabbitMQ's names upstream, binds the downstream's keys
there, and messages come down with `x-received-from`; removing the policy deletes the
link's queue on RabbitMQ."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.differential.peers import RabbitMQServer
from tests.integration.conftest import RunningBroker
from tests.integration.shovel_helpers import amqp_uri, connect, http_call, wait_until
from tests.integration.test_federation import (
    QUIET_S,
    get_all,
    links,
    publish,
    put_policy,
    put_upstream,
    wait_running,
)


@pytest.fixture
def rabbitmq(rabbitmq_links: RabbitMQServer) -> RabbitMQServer:
    """The session's RabbitMQ (tests/integration/conftest.py)."""
    return rabbitmq_links


@pytest.fixture
def down(tmp_path: Path) -> Iterator[RunningBroker]:
    broker = RunningBroker(tmp_path / "down")
    try:
        yield broker
    finally:
        broker.stop()


def rabbit_keys(rabbitmq: RabbitMQServer, exchange: str) -> set[str]:
    path = f"/api/exchanges/%2F/{urllib.parse.quote(exchange, safe='')}/bindings/source"
    status, body = http_call(rabbitmq.http_port, "GET", path)
    if status == 404:
        return set()
    assert status == 200 and isinstance(body, list), (status, body)
    return {b["routing_key"] for b in body if b["destination"].startswith("federation: ")}


def rabbit_queues(rabbitmq: RabbitMQServer) -> dict[str, int]:
    status, body = http_call(rabbitmq.http_port, "GET", "/api/queues/%2F")
    assert status == 200 and isinstance(body, list)
    return {q["name"]: q.get("messages", 0) for q in body}


def test_exchange_federated_from_rabbitmq(rabbitmq: RabbitMQServer, down: RunningBroker) -> None:
    connection = connect(down.amqp_port)
    channel = connection.channel()
    channel.exchange_declare("fed.rx", "topic", durable=True)
    channel.queue_declare("rq", durable=True)
    channel.queue_bind("rq", "fed.rx", "k.*")
    connection.close()
    put_upstream(down, "rabbit", {"uri": amqp_uri(rabbitmq.amqp_port), "expires": 600000})
    put_policy(down, r"^fed\.", {"federation-upstream": "rabbit"}, "exchanges")
    wait_running(down)
    wait_until(lambda: rabbit_keys(rabbitmq, "fed.rx") == {"k.*"}, "the binding on RabbitMQ")
    (upstream_queue,) = [q for q in rabbit_queues(rabbitmq) if q.startswith("federation: fed.rx")]
    assert upstream_queue == "federation: fed.rx -> " + links(down)[0]["node"]

    publish(rabbitmq.amqp_port, "fed.rx", [("k.1", b"from rabbit"), ("z", b"unbound")])
    wait_until(lambda: down.ask(lambda: down.broker.vhosts["/"].queues["rq"].message_count), "rq")
    time.sleep(QUIET_S)
    ((properties, body),) = get_all(down.amqp_port, "rq")
    assert body == b"from rabbit" and properties.delivery_mode == 2
    (hop,) = properties.headers["x-received-from"]
    assert hop["exchange"] == "fed.rx"
    assert hop["uri"] == f"amqp://127.0.0.1:{rabbitmq.amqp_port}/%2F"

    assert down.http("DELETE", "/api/policies/%2F/federate")[0] == 204
    wait_until(lambda: upstream_queue not in rabbit_queues(rabbitmq), "RabbitMQ's queue to go")
    assert rabbit_keys(rabbitmq, "fed.rx") == set()


def test_queue_federated_from_rabbitmq(rabbitmq: RabbitMQServer, down: RunningBroker) -> None:
    """Messages waiting in a RabbitMQ queue come to a consumer of the federated streamq
    queue, with their properties."""
    rabbit = connect(rabbitmq.amqp_port)
    rabbit.channel().queue_declare("work.r", durable=True)
    rabbit.close()
    properties = pika.BasicProperties(delivery_mode=2, correlation_id="c-1", headers={"n": 1})
    connection = connect(rabbitmq.amqp_port)
    channel = connection.channel()
    channel.confirm_delivery()
    for n in range(10):
        channel.basic_publish("", "work.r", b"r-%d" % n, properties)
    connection.close()
    local = connect(down.amqp_port)
    local.channel().queue_declare("work.r", durable=True)
    local.close()
    put_upstream(down, "rabbit", {"uri": amqp_uri(rabbitmq.amqp_port), "prefetch-count": 5})
    put_policy(down, r"^work\.r$", {"federation-upstream": "rabbit"}, "queues")
    wait_running(down)

    consumer = connect(down.amqp_port)
    ch = consumer.channel()
    ch.basic_qos(prefetch_count=2)
    got: list[tuple[pika.BasicProperties, bytes]] = []

    def on_message(
        _ch: object, method: pika.spec.Basic.Deliver, props: pika.BasicProperties, body: bytes
    ) -> None:
        got.append((props, body))
        ch.basic_ack(method.delivery_tag)

    ch.basic_consume("work.r", on_message)
    deadline = time.monotonic() + 30
    while len(got) < 10 and time.monotonic() < deadline:
        consumer.process_data_events(time_limit=0.05)
    consumer.close()
    assert sorted(body for _, body in got) == sorted(b"r-%d" % n for n in range(10))
    props = got[0][0]
    assert props.correlation_id == "c-1" and props.headers["n"] == 1
    assert props.headers["x-received-from"][0]["queue"] == "work.r"
    wait_until(lambda: rabbit_queues(rabbitmq).get("work.r") == 0, "RabbitMQ's queue empty")
