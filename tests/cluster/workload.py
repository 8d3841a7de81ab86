"""The client side of the failover tests: a publisher with confirms and a consumer that
acks, both aio-pika, both reconnecting to any node of the cluster (a follower forwards to
the leader), and a ledger of what each saw.

Owns `Ledger` (every confirmed message id, every delivery with its redelivered flag, when
the last confirm arrived), `Publisher`, `Consumer`, `drain` and `check_ledger` (no
confirmed message lost; a message delivered again only with redelivered set). Every
network step has a timeout: a node that is killed or stopped costs the client one timeout,
then it connects elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

QUEUE: Final = "ha"
CONNECT_TIMEOUT_S: Final = 3.0
CONFIRM_TIMEOUT_S: Final = 8.0
RECONNECT_PAUSE_S: Final = 0.2
HEARTBEAT_S: Final = 2  # a stopped leader is noticed by the consumer within a few seconds
WINDOW: Final = 20  # publishes awaiting their confirm at once
PREFETCH: Final = 50
DRAIN_IDLE_S: Final = 2.0
DRAIN_TIMEOUT_S: Final = 60.0


@dataclass
class Ledger:
    confirmed: set[int] = field(default_factory=set)
    deliveries: dict[int, list[bool]] = field(default_factory=dict)  # id -> redelivered flags
    acked: set[int] = field(default_factory=set)
    published: int = 0
    last_confirm_at: float = 0.0  # monotonic
    confirmed_sent_at: float = 0.0  # when the last confirmed message was published (monotonic)
    reconnects: int = 0

    def delivered(self, message: AbstractIncomingMessage) -> int:
        message_id = int(message.message_id or -1)
        self.deliveries.setdefault(message_id, []).append(bool(message.redelivered))
        return message_id


def url(port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/?heartbeat={HEARTBEAT_S}"


async def connect_any(ports: Callable[[], list[int]], ledger: Ledger) -> AbstractConnection:
    """A connection to the first node (in rotation) that accepts one; retries until one does
    (the caller bounds the wait)."""
    attempt = 0
    while True:
        candidates = ports()
        port = candidates[(ledger.reconnects + attempt) % len(candidates)]
        attempt += 1
        try:
            return await aio_pika.connect(url(port), timeout=CONNECT_TIMEOUT_S)
        except (TimeoutError, OSError, aiormq.exceptions.AMQPError):
            await asyncio.sleep(RECONNECT_PAUSE_S)


async def declare(channel: AbstractChannel) -> None:
    await asyncio.wait_for(channel.declare_queue(QUEUE, durable=True), CONFIRM_TIMEOUT_S)


async def close_quietly(connection: AbstractConnection | None) -> None:
    if connection is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.close(), 1.0)


class Publisher:
    """Persistent messages numbered 0, 1, ... (message_id), WINDOW at a time under
    confirms; an id counts as confirmed only when its basic.ack arrived. On any error the
    batch's unconfirmed ids are given up (never counted) and it reconnects."""

    def __init__(self, ports: Callable[[], list[int]], ledger: Ledger, body_bytes: int = 64):
        self.ports = ports
        self.ledger = ledger
        self.body = b"x" * body_bytes
        self.next_id = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            connection = None
            try:
                connection = await connect_any(self.ports, self.ledger)
                channel = await connection.channel(publisher_confirms=True)
                await declare(channel)
                while not stop.is_set():
                    await self._batch(channel)
            except Exception:
                self.ledger.reconnects += 1
                await asyncio.sleep(RECONNECT_PAUSE_S)
            finally:
                await close_quietly(connection)

    async def _batch(self, channel: AbstractChannel) -> None:
        sent_at = time.monotonic()
        ids = range(self.next_id, self.next_id + WINDOW)
        self.next_id += WINDOW
        self.ledger.published += WINDOW
        results = await asyncio.gather(
            *(self._publish(channel, i) for i in ids), return_exceptions=True
        )
        for message_id, result in zip(ids, results, strict=True):
            if isinstance(result, aiormq.spec.Basic.Ack):
                self.ledger.confirmed.add(message_id)
                self.ledger.last_confirm_at = time.monotonic()
                self.ledger.confirmed_sent_at = sent_at
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def _publish(self, channel: AbstractChannel, message_id: int) -> object:
        message = aio_pika.Message(
            self.body,
            message_id=str(message_id),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        return await asyncio.wait_for(
            channel.default_exchange.publish(message, QUEUE), CONFIRM_TIMEOUT_S
        )


class Consumer:
    """basic.consume on QUEUE with manual acks; every delivery goes into the ledger before
    its ack. Reconnects when its connection closes (heartbeats notice a stopped node)."""

    def __init__(self, ports: Callable[[], list[int]], ledger: Ledger) -> None:
        self.ports = ports
        self.ledger = ledger

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        message_id = self.ledger.delivered(message)
        with contextlib.suppress(Exception):
            await message.ack()
            self.ledger.acked.add(message_id)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            connection = None
            try:
                connection = await connect_any(self.ports, self.ledger)
                channel = await connection.channel()
                await channel.set_qos(prefetch_count=PREFETCH)
                await declare(channel)
                queue = await channel.get_queue(QUEUE, ensure=False)
                await queue.consume(self.on_message)
                while not stop.is_set() and not connection.is_closed and not channel.is_closed:
                    await asyncio.sleep(RECONNECT_PAUSE_S)
            except Exception:
                self.ledger.reconnects += 1
                await asyncio.sleep(RECONNECT_PAUSE_S)
            finally:
                await close_quietly(connection)


def numbered(message_id: int) -> aio_pika.Message:
    """A persistent message with `message_id` as its id."""
    return aio_pika.Message(
        b"split", message_id=str(message_id), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
    )


async def publish_confirmed(port: int, ids: range, ledger: Ledger) -> None:
    """Publishes `ids` one at a time straight to the node on `port`, each confirmed."""
    connection = await aio_pika.connect(url(port), timeout=CONNECT_TIMEOUT_S)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(QUEUE, durable=True)
        for message_id in ids:
            confirm = await asyncio.wait_for(
                channel.default_exchange.publish(numbered(message_id), QUEUE), CONFIRM_TIMEOUT_S
            )
            assert isinstance(confirm, aiormq.spec.Basic.Ack)
            ledger.confirmed.add(message_id)


async def publish_pending(channel: AbstractChannel, message_id: int) -> object:
    """One publish under confirms, awaited with no timeout (the caller bounds it)."""
    return await channel.default_exchange.publish(numbered(message_id), QUEUE)


def acked(task: asyncio.Task[object]) -> bool:
    """Whether a publish_pending task ended with a basic.ack (a confirm)."""
    if not task.done() or task.cancelled() or task.exception() is not None:
        return False
    return isinstance(task.result(), aiormq.spec.Basic.Ack)


async def drain(port: int, ledger: Ledger) -> int:
    """basic.get (with ack) until QUEUE stays empty for DRAIN_IDLE_S; every message goes
    into the ledger. Returns how many were drained."""
    connection = await aio_pika.connect(url(port), timeout=CONNECT_TIMEOUT_S)
    drained = 0
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(QUEUE, durable=True, passive=True)
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < DRAIN_IDLE_S:
            assert time.monotonic() < deadline, f"drain still getting messages after {drained}"
            message = await asyncio.wait_for(queue.get(fail=False), CONFIRM_TIMEOUT_S)
            if message is None:
                await asyncio.sleep(0.1)
                continue
            ledger.delivered(message)
            await message.ack()
            drained += 1
            idle_since = time.monotonic()
    return drained


def check_ledger(ledger: Ledger) -> None:
    """No confirmed message lost; every delivery after a message's first one flagged
    redelivered (an ack lost in a failover, or a delivery cut by a closed connection)."""
    lost = sorted(ledger.confirmed - ledger.deliveries.keys())
    assert not lost, f"{len(lost)} confirmed messages lost, first ones: {lost[:20]}"
    unflagged = {
        message_id: flags for message_id, flags in ledger.deliveries.items() if not all(flags[1:])
    }
    assert not unflagged, (
        f"delivered again without redelivered: {dict(list(unflagged.items())[:10])}"
    )


async def stop_workload(
    tasks: list[asyncio.Task[None]], stop: asyncio.Event, timeout_s: float
) -> None:
    """Stops the workload's tasks: sets `stop`, waits at most `timeout_s`, cancels the rest."""
    stop.set()
    _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def start_workload(
    ports: Callable[[], list[int]],
) -> tuple[Ledger, asyncio.Event, list[asyncio.Task[None]]]:
    """A Publisher and a Consumer running against `ports` until the event is set (see
    `stop_workload`): the ledger, the event and their tasks."""
    ledger, stop = Ledger(), asyncio.Event()
    tasks = [
        asyncio.create_task(Publisher(ports, ledger).run(stop)),
        asyncio.create_task(Consumer(ports, ledger).run(stop)),
    ]
    return ledger, stop, tasks


async def wait_confirms_after(ledger: Ledger, since: float, timeout_s: float, what: str) -> float:
    """Seconds from `since` (monotonic) to the first confirm of a message published after
    it; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while ledger.confirmed_sent_at <= since:
        assert time.monotonic() < deadline, f"no confirm {what} within {timeout_s} s"
        await asyncio.sleep(0.05)
    return ledger.last_confirm_at - since
