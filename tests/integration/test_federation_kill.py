"""Exchange federation is at least once: SIGKILL the upstream or the downstream broker in
the middle of a transfer, start it again on the same directory and ports, and every
message published upstream (committed) reaches the downstream queue (duplicates are
allowed and counted). The killed broker runs as `streamq serve` in its own process; the
other one in-process. Both on loopback ports."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.broker_process import RestartableBroker
from tests.integration.conftest import RunningBroker
from tests.integration.shovel_helpers import amqp_uri, connect, http_call, wait_until

MESSAGES = 4000
TIMEOUT_S = 60.0


def setup_downstream(down_amqp: int, down_http: int, up_amqp: int) -> None:
    connection = connect(down_amqp)
    channel = connection.channel()
    channel.exchange_declare("fed.k", "direct", durable=True)
    channel.queue_declare("q", durable=True)
    channel.queue_bind("q", "fed.k", "k")
    connection.close()
    path = "/api/parameters/federation-upstream/%2F/up"
    value = {"uri": amqp_uri(up_amqp), "reconnect-delay": 0.2, "prefetch-count": 200}
    assert http_call(down_http, "PUT", path, {"value": value})[0] in (201, 204)
    policy = {"pattern": r"^fed\.", "definition": {"federation-upstream": "up"}}
    assert http_call(down_http, "PUT", "/api/policies/%2F/fed", policy)[0] in (201, 204)


def upstream_bound(up_http: int) -> bool:
    status, body = http_call(up_http, "GET", "/api/exchanges/%2F/fed.k/bindings/source")
    return status == 200 and isinstance(body, list) and any(b["routing_key"] == "k" for b in body)


def publish_confirmed(port: int, first: int, count: int) -> None:
    """Publish persistent messages in one transaction: durable once tx.commit-ok came
    (one sync for all, where confirms one at a time would wait a sync each)."""
    connection = connect(port)
    channel = connection.channel()
    channel.tx_select()
    properties = pika.BasicProperties(delivery_mode=2)
    for n in range(first, first + count):
        channel.basic_publish("fed.k", "k", b"m-%d" % n, properties)
    channel.tx_commit()
    connection.close()


def collect(port: int, wanted: int) -> collections.Counter[bytes]:
    """Consume `q` until `wanted` distinct bodies came (or the timeout)."""
    seen: collections.Counter[bytes] = collections.Counter()
    deadline = time.monotonic() + TIMEOUT_S
    while len(seen) < wanted and time.monotonic() < deadline:
        try:
            connection = connect(port)
        except pika.exceptions.AMQPConnectionError:
            time.sleep(0.2)
            continue
        try:
            channel = connection.channel()
            while len(seen) < wanted and time.monotonic() < deadline:
                method, _props, body = channel.basic_get("q", auto_ack=True)
                if method is None:
                    connection.process_data_events(time_limit=0.05)
                    continue
                seen[body] += 1
        except pika.exceptions.AMQPError:
            time.sleep(0.2)
        finally:
            if connection.is_open:
                connection.close()
    return seen


@pytest.fixture
def in_process(tmp_path: Path) -> Iterator[RunningBroker]:
    broker = RunningBroker(tmp_path / "in-process")
    try:
        yield broker
    finally:
        broker.stop()


def test_upstream_killed_mid_transfer(tmp_path: Path, in_process: RunningBroker) -> None:
    up = RestartableBroker(tmp_path / "up")
    try:
        setup_downstream(in_process.amqp_port, in_process.http_port, up.amqp_port)
        wait_until(lambda: upstream_bound(up.http_port), "the binding upstream")
        publish_confirmed(up.amqp_port, 0, MESSAGES // 2)
        up.kill_and_restart()
        wait_until(lambda: upstream_bound(up.http_port), "the binding after the restart")
        publish_confirmed(up.amqp_port, MESSAGES // 2, MESSAGES // 2)
        seen = collect(in_process.amqp_port, MESSAGES)
        assert set(seen) == {b"m-%d" % n for n in range(MESSAGES)}
        duplicates = sum(seen.values()) - len(seen)
        assert duplicates <= MESSAGES, duplicates
    finally:
        up.stop()


def test_downstream_killed_mid_transfer(tmp_path: Path, in_process: RunningBroker) -> None:
    down = RestartableBroker(tmp_path / "down")
    try:
        setup_downstream(down.amqp_port, down.http_port, in_process.amqp_port)
        wait_until(lambda: upstream_bound(in_process.http_port), "the binding upstream")
        publish_confirmed(in_process.amqp_port, 0, MESSAGES)
        down.kill_and_restart()  # while the link moves them
        seen = collect(down.amqp_port, MESSAGES)
        assert set(seen) == {b"m-%d" % n for n in range(MESSAGES)}
    finally:
        down.stop()
