"""The round gate against a real broker: what waits for the replicas, and stepping down.

Method: a broker runs in-process with a test gate on its Syncer (the role the cluster's
replication server plays). While the gate holds rounds, a publisher's confirm and a
management reply must not arrive (checked for a bounded while); once it releases them they
arrive. A gate that fails rounds with ReplicationFenced (the node lost its lease) gets no
confirm out, and the broker still stops cleanly: `Broker.aclose()` neither hangs nor
raises.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

from streamq.log.errors import ReplicationFenced
from tests.integration.conftest import RunningBroker

HELD_S = 1.0  # how long a held reply is watched for not arriving
ARRIVE_S = 10.0  # how long a released one may take


class HoldingGate:
    """Holds every round until `release()`; `fence()` fails the held and later ones."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[Callable[[BaseException | None], None]] = []
        self._outcome: BaseException | bool | None = False  # False: holding
        self.rounds = 0

    def hold(self, done: Callable[[BaseException | None], None]) -> None:
        with self._lock:
            self.rounds += 1
            if self._outcome is False:
                self._held.append(done)
                return
            outcome = self._outcome
        done(outcome if isinstance(outcome, BaseException) else None)

    def release(self) -> None:
        self._settle(None)

    def fence(self) -> None:
        self._settle(ReplicationFenced())

    def _settle(self, outcome: BaseException | None) -> None:
        with self._lock:
            self._outcome = outcome
            held, self._held = self._held, []
        for done in held:
            done(outcome)


@pytest.fixture
def rb(tmp_path: Path) -> Iterator[RunningBroker]:
    broker = RunningBroker(tmp_path)
    try:
        yield broker
    finally:
        broker.stop()


def gated(rb: RunningBroker) -> HoldingGate:
    gate = HoldingGate()
    assert rb.broker is not None
    rb.broker.syncer.gate = gate
    return gate


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run `fn` on a daemon thread; its result or exception lands in the list."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def confirmed_publish(rb: RunningBroker, queue: str) -> Callable[[], object]:
    """A persistent publish under confirms on a new connection (declared before the gate
    is set): returns once the broker confirmed it."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", rb.amqp_port))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()

    def publish() -> object:
        try:
            channel.basic_publish("", queue, b"m", pika.BasicProperties(delivery_mode=2))
            return "confirmed"
        finally:
            if connection.is_open:
                connection.close()

    return publish


def test_a_confirm_waits_for_the_gate(rb: RunningBroker) -> None:
    publish = confirmed_publish(rb, "q")
    gate = gated(rb)
    thread, out = in_thread(publish)
    thread.join(HELD_S)
    assert thread.is_alive(), f"confirmed before the replicas had it: {out}"
    assert gate.rounds >= 1
    gate.release()
    thread.join(ARRIVE_S)
    assert out == ["confirmed"]


def test_a_management_reply_waits_for_the_gate(rb: RunningBroker) -> None:
    gate = gated(rb)
    thread, out = in_thread(lambda: rb.http("PUT", "/api/users/bob", {"password": "x"})[0])
    thread.join(HELD_S)
    assert thread.is_alive(), f"answered before the replicas had it: {out}"
    gate.release()
    thread.join(ARRIVE_S)
    assert out == [201]
    assert rb.http("GET", "/api/users/bob")[0] == 200


def test_a_fenced_gate_sends_no_confirm_and_the_broker_still_stops(rb: RunningBroker) -> None:
    publish = confirmed_publish(rb, "q")
    gate = gated(rb)
    thread, out = in_thread(publish)
    thread.join(HELD_S)
    assert thread.is_alive()
    gate.fence()
    thread.join(ARRIVE_S)
    assert not thread.is_alive()
    assert out != ["confirmed"]
    # The publisher hears why, and never a confirm.
    assert isinstance(out[0], pika.exceptions.ConnectionClosedByBroker)
    assert "no longer the cluster leader" in str(out[0])
    rb.stop()  # asserts the broker's thread ended: aclose did not hang
    assert rb.error is None  # nor raise
