"""Federation between streamq brokers, as RabbitMQ's federation plugin does it: upstreams
and policies set over the management API, exchange federation (bindings propagate
upstream, messages come down with `x-received-from`, a ring with max-hops 1 does not
loop), queue federation (consumers on both sides share one workload), and the status of
links in `/api/federation-links`. Every broker runs in-process on loopback port 0."""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.conftest import RunningBroker
from tests.integration.shovel_helpers import amqp_uri, connect, http_call, wait_until

QUIET_S = 0.7  # how long a test waits to see that nothing (more) arrives


def put_upstream(down: RunningBroker, name: str, value: dict[str, object]) -> None:
    path = f"/api/parameters/federation-upstream/%2F/{name}"
    status, body = http_call(down.http_port, "PUT", path, {"value": value})
    assert status in (201, 204), (status, body)


def put_policy(broker: RunningBroker, pattern: str, definition: dict[str, object], to: str) -> None:
    body = {"pattern": pattern, "definition": definition, "apply-to": to}
    assert broker.put_policy("federate", body) in (201, 204)


def links(broker: RunningBroker) -> list[dict[str, object]]:
    status, body = http_call(broker.http_port, "GET", "/api/federation-links/%2F")
    assert status == 200, (status, body)
    assert isinstance(body, list)
    return body


def wait_running(broker: RunningBroker, count: int = 1) -> list[dict[str, object]]:
    def check() -> list[dict[str, object]] | None:
        found = links(broker)
        return (
            found if len(found) == count and all(f["status"] == "running" for f in found) else None
        )

    found = wait_until(check, f"{count} running federation link(s)")
    assert isinstance(found, list)
    return found


def upstream_keys(up: RunningBroker, exchange: str) -> set[str]:
    """The binding keys from `exchange` to the federation's internal exchanges."""
    path = f"/api/exchanges/%2F/{urllib.parse.quote(exchange, safe='')}/bindings/source"
    status, body = http_call(up.http_port, "GET", path)
    assert status == 200 and isinstance(body, list), (status, body)
    return {b["routing_key"] for b in body if b["destination"].startswith("federation: ")}


def queue_names(broker: RunningBroker) -> set[str]:
    status, body = http_call(broker.http_port, "GET", "/api/queues/%2F")
    assert status == 200 and isinstance(body, list)
    return {q["name"] for q in body}


def get_all(port: int, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
    connection = connect(port)
    try:
        channel = connection.channel()
        got = []
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            got.append((properties, body))
    finally:
        connection.close()


def publish(port: int, exchange: str, keys_bodies: list[tuple[str, bytes]]) -> None:
    connection = connect(port)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for key, body in keys_bodies:
            channel.basic_publish(exchange, key, body, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RunningBroker, RunningBroker]]:
    up = RunningBroker(tmp_path / "up")
    down = RunningBroker(tmp_path / "down")
    try:
        yield up, down
    finally:
        down.stop()
        up.stop()


def test_exchange_federation_follows_bindings(pair: tuple[RunningBroker, RunningBroker]) -> None:
    up, down = pair
    connection = connect(down.amqp_port)
    channel = connection.channel()
    channel.exchange_declare("fed.x", "topic", durable=True)
    channel.queue_declare("q", durable=True)
    channel.queue_bind("q", "fed.x", "a.*")
    put_upstream(down, "up", {"uri": amqp_uri(up.amqp_port)})
    put_policy(down, r"^fed\.", {"federation-upstream": "up"}, "exchanges")
    (link,) = wait_running(down)
    assert link["exchange"] == "fed.x" and link["upstream_exchange"] == "fed.x"
    assert link["upstream"] == "up" and link["type"] == "exchange"
    assert link["uri"] == f"amqp://127.0.0.1:{up.amqp_port}/%2F"
    wait_until(lambda: upstream_keys(up, "fed.x") == {"a.*"}, "the binding upstream")

    publish(up.amqp_port, "fed.x", [("a.b", b"bound"), ("c.d", b"unbound")])
    wait_until(lambda: down.ask(lambda: down.broker.vhosts["/"].queues["q"].message_count), "q")
    time.sleep(QUIET_S)
    ((properties, body),) = get_all(down.amqp_port, "q")
    assert body == b"bound" and properties.delivery_mode == 2
    assert links(down)[0]["transferred"] == 1  # the unbound key did not travel
    (hop,) = properties.headers["x-received-from"]
    assert hop["exchange"] == "fed.x" and hop["redelivered"] is False
    assert hop["uri"] == f"amqp://127.0.0.1:{up.amqp_port}/%2F"  # no credentials

    # A second key binds upstream; removing the first unbinds it and stops its flow.
    channel.queue_bind("q", "fed.x", "b.#")
    channel.queue_unbind("q", "fed.x", "a.*")
    wait_until(lambda: upstream_keys(up, "fed.x") == {"b.#"}, "the bindings upstream")
    publish(up.amqp_port, "fed.x", [("a.b", b"gone"), ("b.c.d", b"new")])
    time.sleep(QUIET_S)
    assert [body for _, body in get_all(down.amqp_port, "q")] == [b"new"]
    connection.close()

    # Without the policy the link stops and its queue upstream is deleted.
    (upstream_queue,) = [q for q in queue_names(up) if q.startswith("federation: fed.x -> ")]
    assert down.http("DELETE", "/api/policies/%2F/federate")[0] == 204
    wait_until(lambda: not links(down), "the link to stop")
    wait_until(lambda: upstream_queue not in queue_names(up), "the upstream queue to go")
    assert upstream_keys(up, "fed.x") == set()


@pytest.mark.parametrize("mode", ["on-publish", "no-ack"])
def test_ack_modes(pair: tuple[RunningBroker, RunningBroker], mode: str) -> None:
    up, down = pair
    connection = connect(down.amqp_port)
    channel = connection.channel()
    channel.exchange_declare("fed.m", "direct", durable=True)
    channel.queue_declare("q", durable=True)
    channel.queue_bind("q", "fed.m", "k")
    connection.close()
    value = {"uri": amqp_uri(up.amqp_port), "ack-mode": mode, "prefetch-count": 10}
    put_upstream(down, "up", value)
    put_policy(down, r"^fed\.", {"federation-upstream": "up"}, "exchanges")
    wait_running(down)
    wait_until(lambda: upstream_keys(up, "fed.m") == {"k"}, "the binding upstream")
    publish(up.amqp_port, "fed.m", [("k", b"%d" % n) for n in range(500)])

    def moved() -> bool:
        return down.ask(lambda: down.broker.vhosts["/"].queues["q"].message_count) == 500

    wait_until(moved, "500 messages downstream")
    (upstream_queue,) = [q for q in queue_names(up) if q.startswith("federation: fed.m")]
    path = f"/api/queues/%2F/{urllib.parse.quote(upstream_queue, safe='')}"

    def settled() -> bool:
        status, body = http_call(up.http_port, "GET", path)
        return status == 200 and isinstance(body, dict) and body["messages"] == 0

    wait_until(settled, "nothing left unacked upstream")
    assert [b for _, b in get_all(down.amqp_port, "q")] == [b"%d" % n for n in range(500)]


def test_upstream_set_with_an_override(tmp_path: Path) -> None:
    """A policy naming an upstream set links the exchange to each member; a member's
    `exchange` overrides its upstream's."""
    brokers = [RunningBroker(tmp_path / name) for name in ("u1", "u2", "down")]
    u1, u2, down = brokers
    try:
        connection = connect(down.amqp_port)
        channel = connection.channel()
        channel.exchange_declare("fed.s", "fanout", durable=True)
        channel.queue_declare("q", durable=True)
        channel.queue_bind("q", "fed.s", "")
        connection.close()
        put_upstream(down, "u1", {"uri": amqp_uri(u1.amqp_port)})
        put_upstream(down, "u2", {"uri": amqp_uri(u2.amqp_port)})
        members = [{"upstream": "u1"}, {"upstream": "u2", "exchange": "other"}]
        path = "/api/parameters/federation-upstream-set/%2F/both"
        assert http_call(down.http_port, "PUT", path, {"value": members})[0] in (201, 204)
        put_policy(down, r"^fed\.", {"federation-upstream-set": "both"}, "exchanges")
        found = wait_running(down, 2)
        assert {(f["upstream"], f["upstream_exchange"]) for f in found} == {
            ("u1", "fed.s"),
            ("u2", "other"),
        }
        wait_until(lambda: upstream_keys(u1, "fed.s") == {""}, "the binding on u1")
        wait_until(lambda: upstream_keys(u2, "other") == {""}, "the binding on u2")
        publish(u1.amqp_port, "fed.s", [("", b"from u1")])
        publish(u2.amqp_port, "other", [("", b"from u2")])

        def both() -> bool:
            return down.ask(lambda: down.broker.vhosts["/"].queues["q"].message_count) == 2

        wait_until(both, "a message from each upstream")
        assert sorted(b for _, b in get_all(down.amqp_port, "q")) == [b"from u1", b"from u2"]
    finally:
        for broker in brokers:
            broker.stop()


def test_messages_wait_upstream_while_the_downstream_is_down(tmp_path: Path) -> None:
    """A downstream's shutdown leaves its queue upstream: what is published meanwhile
    comes down once it runs again (the link starts from its durable upstream and policy)."""
    up = RunningBroker(tmp_path / "up")
    down = RunningBroker(tmp_path / "down")
    try:
        connection = connect(down.amqp_port)
        channel = connection.channel()
        channel.exchange_declare("fed.r", "direct", durable=True)
        channel.queue_declare("q", durable=True)
        channel.queue_bind("q", "fed.r", "k")
        connection.close()
        put_upstream(down, "up", {"uri": amqp_uri(up.amqp_port)})
        put_policy(down, r"^fed\.", {"federation-upstream": "up"}, "exchanges")
        wait_running(down)
        wait_until(lambda: upstream_keys(up, "fed.r") == {"k"}, "the binding upstream")
        down.stop()
        publish(up.amqp_port, "fed.r", [("k", b"while-down-%d" % n) for n in range(20)])
        down = RunningBroker(tmp_path / "down")
        wait_running(down)

        def arrived() -> bool:
            return down.ask(lambda: down.broker.vhosts["/"].queues["q"].message_count) == 20

        wait_until(arrived, "the messages published while the downstream was down")
        bodies = [body for _, body in get_all(down.amqp_port, "q")]
        assert bodies == [b"while-down-%d" % n for n in range(20)]
    finally:
        down.stop()
        up.stop()


def test_ring_of_three_with_max_hops_1_does_not_loop(tmp_path: Path) -> None:
    """Three brokers, each federating `ring` from the previous one (a -> b -> c -> a):
    a message published on a reaches b once, and goes no further."""
    brokers = [RunningBroker(tmp_path / name) for name in "abc"]
    try:
        for index, broker in enumerate(brokers):
            previous = brokers[index - 1]
            connection = connect(broker.amqp_port)
            channel = connection.channel()
            channel.exchange_declare("ring", "fanout", durable=True)
            channel.queue_declare("seen", durable=True)
            channel.queue_bind("seen", "ring", "")
            connection.close()
            put_upstream(broker, "prev", {"uri": amqp_uri(previous.amqp_port), "max-hops": 1})
            put_policy(broker, "^ring$", {"federation-upstream": "prev"}, "exchanges")
        for broker in brokers:
            wait_running(broker)
        for broker in brokers:
            wait_until(lambda b=broker: upstream_keys(b, "ring") == {""}, "ring bindings")
        publish(brokers[0].amqp_port, "ring", [("", b"once")])
        a, b, c = brokers
        wait_until(lambda: get_all(b.amqp_port, "seen"), "the message on b")
        time.sleep(2 * QUIET_S)
        assert [body for _, body in get_all(a.amqp_port, "seen")] == [b"once"]
        assert get_all(b.amqp_port, "seen") == []
        assert get_all(c.amqp_port, "seen") == []
    finally:
        for broker in brokers:
            broker.stop()


def test_queue_federation_shares_the_workload(pair: tuple[RunningBroker, RunningBroker]) -> None:
    """Messages published upstream stay there while the downstream queue has no
    consumer; a downstream consumer with credit then takes them, and with consumers on
    both sides each gets part of the work."""
    up, down = pair
    for broker in pair:
        connection = connect(broker.amqp_port)
        connection.channel().queue_declare("work", durable=True)
        connection.close()
    put_upstream(down, "up", {"uri": amqp_uri(up.amqp_port), "prefetch-count": 1})
    put_policy(down, "^work$", {"federation-upstream": "up"}, "queues")
    (link,) = wait_running(down)
    assert link["queue"] == "work" and link["upstream_queue"] == "work"
    publish(up.amqp_port, "", [("work", b"early-%d" % n) for n in range(5)])
    time.sleep(QUIET_S)
    upstream = up.ask(lambda: up.broker.vhosts["/"].queues["work"].message_count)
    assert upstream == 5, "nothing moves without a downstream consumer"

    # A downstream consumer: the upstream's messages come to it.
    down_conn = connect(down.amqp_port)
    down_ch = down_conn.channel()
    down_ch.basic_qos(prefetch_count=1)
    got_down: list[bytes] = []

    def on_down(ch: object, method: pika.spec.Basic.Deliver, _p: object, body: bytes) -> None:
        got_down.append(body)
        time.sleep(0.02)
        down_ch.basic_ack(method.delivery_tag)

    down_ch.basic_consume("work", on_down)
    deadline = time.monotonic() + 20
    while len(got_down) < 5 and time.monotonic() < deadline:
        down_conn.process_data_events(time_limit=0.05)
    assert sorted(got_down) == sorted(b"early-%d" % n for n in range(5))

    # Consumers on both sides share what is published upstream.
    up_conn = connect(up.amqp_port)
    up_ch = up_conn.channel()
    up_ch.basic_qos(prefetch_count=1)
    got_up: list[bytes] = []
    publish(up.amqp_port, "", [("work", b"job-%d" % n) for n in range(40)])
    got_down.clear()
    deadline = time.monotonic() + 30
    while len(got_up) + len(got_down) < 40 and time.monotonic() < deadline:
        method, _props, body = up_ch.basic_get("work")
        if method is not None:
            got_up.append(body)
            time.sleep(0.02)
            up_ch.basic_ack(method.delivery_tag)
        down_conn.process_data_events(time_limit=0.02)
    assert sorted(got_up + got_down) == sorted(b"job-%d" % n for n in range(40))
    assert got_up and got_down, (len(got_up), len(got_down))
    up_conn.close()
    down_conn.close()


def test_unreachable_upstream_shows_its_error(tmp_path: Path) -> None:
    down = RunningBroker(tmp_path / "down")
    try:
        with refused_port() as port:  # a port nobody listens on
            put_upstream(down, "nowhere", {"uri": f"amqp://127.0.0.1:{port}", "reconnect-delay": 1})
            put_policy(down, "^fed$", {"federation-upstream-pattern": "^now"}, "exchanges")
            connection = connect(down.amqp_port)
            connection.channel().exchange_declare("fed", "fanout")
            connection.close()

            def failed() -> dict[str, object] | None:
                found = links(down)
                return found[0] if found and found[0]["status"] == "error" else None

            link = wait_until(failed, "the error status")
            assert isinstance(link, dict) and "refused" in str(link["error"]).lower(), link
            # Still there, still retrying, and the broker still serves.
            time.sleep(1.5)
            assert links(down)[0]["status"] in ("error", "starting")
            assert down.http("GET", "/api/overview")[0] == 200
    finally:
        down.stop()


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port bound but not listening: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        yield port
