"""Classic queues keep at most the paging budget of message bodies in memory: past it the
oldest durable bodies are read back from the log when delivered. Method: lower the budget
to 1 MiB (the module constant, read when a vhost opens), publish 6 MiB of persistent
messages with confirms, check what stays resident, then consume everything, in order and
intact; the same after a restart, which restores past the budget without loading it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from streamq.broker import paging
from streamq.broker.paging import PagedMessage
from tests.integration.conftest import RunningBroker, broker_on, publish_persistent

BUDGET_BYTES = 1024 * 1024
BODY_BYTES = 64 * 1024
COUNT = 96


@pytest.fixture
def small_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paging, "RESIDENT_BYTES_MAX", BUDGET_BYTES)
    monkeypatch.setattr(paging, "RESIDENT_BYTES_LOW", BUDGET_BYTES // 2)


@pytest.fixture
def running(tmp_path: Path, small_budget: None) -> Iterator[RunningBroker]:
    started = RunningBroker(tmp_path / "data")
    yield started
    started.stop()


def _memory(running: RunningBroker) -> tuple[int, int]:
    """(resident body bytes, paged messages) of vhost /."""

    def read() -> tuple[int, int]:
        assert running.broker is not None
        vhost = running.broker.vhosts["/"]
        paged = sum(1 for m in vhost.messages.values() if isinstance(m, PagedMessage))
        return vhost.pager.resident_bytes, paged

    return running.ask(read)


def _body(i: int) -> bytes:
    return i.to_bytes(4, "big") * (BODY_BYTES // 4)


def _publish(port: int) -> None:
    publish_persistent(port, "paged", (_body(i) for i in range(COUNT)))


def _wait_paged(running: RunningBroker) -> tuple[int, int]:
    deadline = time.monotonic() + 10
    resident, paged = _memory(running)
    while resident > BUDGET_BYTES and time.monotonic() < deadline:
        time.sleep(0.05)
        resident, paged = _memory(running)
    return resident, paged


def _consume_all(port: int) -> list[bytes]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    bodies = []
    for method, _, body in channel.consume("paged", inactivity_timeout=5):
        assert method is not None, f"only {len(bodies)} of {COUNT} delivered"
        bodies.append(body)
        channel.basic_ack(method.delivery_tag)
        if len(bodies) == COUNT:
            break
    channel.cancel()
    connection.close()
    return bodies


def test_bodies_past_the_budget_are_paged_and_delivered_intact(running: RunningBroker) -> None:
    _publish(running.amqp_port)
    resident, paged = _wait_paged(running)
    assert resident <= BUDGET_BYTES
    assert paged >= COUNT - BUDGET_BYTES // BODY_BYTES
    assert _consume_all(running.amqp_port) == [_body(i) for i in range(COUNT)]
    assert _memory(running) == (0, 0), "every message released, none left counted"


def test_a_restart_restores_past_the_budget_without_loading_it(
    tmp_path: Path, small_budget: None
) -> None:
    with broker_on(tmp_path / "data") as first:
        _publish(first.amqp_port)
    with broker_on(tmp_path / "data") as second:
        resident, paged = _memory(second)
        assert resident <= BUDGET_BYTES
        assert paged == COUNT - resident // BODY_BYTES
        assert _consume_all(second.amqp_port) == [_body(i) for i in range(COUNT)]
