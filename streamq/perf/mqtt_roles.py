"""The two worker processes of `streamq perf mqtt throughput`: publishers and consumers.

Owns what runs inside them: one asyncio loop per process (uvloop when installed), one
connection and one task per publisher (client id `publisher-N`, as lavinmqperf) or
consumer (`consumer-N`, subscribed to the topic at `--qos`), readiness and `go` through
`Shared`, counts into `Shared` after every write and read. A publisher writes batches of
pre-encoded publishes (`mqtt_wire.PublishBatch`): at QoS 0 as fast as the socket takes
them, at QoS 1 up to `--max-inflight` unacknowledged, and at the end waits for its
PUBACKs. A consumer acknowledges the QoS 1 deliveries of each read in one write. Rates
(`-r`, `-R`) are per client; the `-C` and `-D` budgets are shared by all processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final

from streamq.perf.errors import PerfError
from streamq.perf.mqtt_client import IO_TIMEOUT_S, PerfConnection, open_connection, subscribe
from streamq.perf.mqtt_options import MqttThroughputConfig
from streamq.perf.mqtt_wire import PublishBatch, body_pattern, pubacks
from streamq.perf.shared import Shared
from streamq.perf.worker import GO_TIMEOUT_S

POLL_S: Final = 0.05
"""The longest sleep between two looks at the stop flag and the budgets."""
GO_POLL_S: Final = 0.005
CONNECTING_MAX: Final = 64
"""Connections opened at the same time by one process."""
IDLE_TIMEOUT_S: Final = 30.0
"""With a `-D` budget, how long the consumers together may go without a delivery."""


def run_loop(work: Callable[[], Coroutine[Any, Any, None]]) -> bytes:
    """Run `work` on a fresh event loop (uvloop when installed); the worker's result."""
    try:
        import uvloop  # noqa: PLC0415  # optional: the broker's extra installs it

        uvloop.run(work())
    except ImportError:
        asyncio.run(work())
    return b""


async def connect_all(
    config: MqttThroughputConfig, role: str, count: int, expected: bytes | None = None
) -> list[PerfConnection]:
    """Open `count` connections, CONNECTING_MAX at a time. Raises `PerfError` (after
    closing those that opened) when one fails."""
    gate = asyncio.Semaphore(CONNECTING_MAX)
    connections: list[PerfConnection] = []

    async def one(index: int) -> None:
        async with gate:
            connections.append(
                await open_connection(
                    config.uri,
                    f"{role}-{index}",
                    clean_session=config.clean_session,
                    expected_body=expected,
                )
            )

    try:
        await all_or_first_error([one(i) for i in range(count)])
    except BaseException:
        for connection in connections:
            connection.close()
        raise
    return connections


async def all_or_first_error(work: list[Coroutine[Any, Any, None]]) -> None:
    """Run `work` concurrently; at the first error cancel the rest and raise it."""
    tasks = [asyncio.ensure_future(item) for item in work]
    try:
        done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
    for task in done:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error


async def wait_for_go(shared: Shared) -> None:
    """Tell the parent this process is ready and wait until all are. Raises
    `PerfError` after GO_TIMEOUT_S, or when the parent stops the run first."""
    shared.mark_ready()
    deadline = time.monotonic() + GO_TIMEOUT_S
    while not shared.going():
        if shared.stopping():
            raise PerfError("stopped before the start")
        if time.monotonic() > deadline:
            raise PerfError("timed out waiting for the other workers to connect")
        await asyncio.sleep(GO_POLL_S)


async def watch_stop(shared: Shared, connections: list[PerfConnection]) -> None:
    """Wake every connection's waiter once the parent says stop."""
    while not shared.stopping():
        await asyncio.sleep(POLL_S)
    for connection in connections:
        connection.wake.set()


async def run_publishers(config: MqttThroughputConfig, shared: Shared) -> None:
    connections = await connect_all(config, "publisher", config.publishers)
    try:
        await wait_for_go(shared)
        watcher = asyncio.get_running_loop().create_task(watch_stop(shared, connections))
        publishers = [Publisher(config, shared, i, c) for i, c in enumerate(connections)]
        await asyncio.gather(*(publisher.run() for publisher in publishers))
        watcher.cancel()
    finally:
        for connection in connections:
            connection.close(graceful=True)


async def run_consumers(config: MqttThroughputConfig, shared: Shared) -> None:
    expected = body_pattern(config.body_bytes) if config.verify else None
    connections = await connect_all(config, "consumer", config.consumers, expected)
    try:
        for connection in connections:
            await subscribe(connection, config.topic, config.qos)
        consumers = [Consumer(config, shared, i, c) for i, c in enumerate(connections)]
        await wait_for_go(shared)
        for consumer in consumers:
            consumer.start_clock()  # `-R` counts from the start, not from the subscribe
        await consume_until_done(config, shared, consumers)
    finally:
        for connection in connections:
            connection.close(graceful=True)


class Publisher:
    def __init__(
        self, config: MqttThroughputConfig, shared: Shared, index: int, c: PerfConnection
    ) -> None:
        self.config = config
        self.shared = shared
        self.index = index
        self.connection = c
        self.batch = PublishBatch(
            config.topic,
            config.body_bytes,
            config.qos,
            retain=config.retain,
            random=config.random_bodies,
        )
        self.published = 0
        self.started = time.monotonic()

    def acked(self) -> int:
        return self.connection.incoming.pubacks

    def room(self) -> int:
        """How many publishes the next batch may hold now."""
        count = self.batch.count_max
        if self.config.qos:
            count = min(count, self.config.max_inflight - (self.published - self.acked()))
        if self.config.publish_rate:
            due = int(self.config.publish_rate * (time.monotonic() - self.started))
            count = min(count, due - self.published)
        return max(0, count)

    async def run(self) -> None:
        connection = self.connection
        while not self.shared.stopping():
            connection.check(f"publisher {self.index}")
            count = self.room()
            if count == 0:
                await self.wait_for_room()
                continue
            count = self.shared.claim_publishes(count)
            if count == 0:
                break
            connection.write(self.batch.take(count))
            self.published += count
            self.report()
            if connection.writable.is_set():
                await asyncio.sleep(0)  # let the other clients of this process write
            else:
                await connection.writable.wait()
        await self.finish()

    async def wait_for_room(self) -> None:
        connection = self.connection
        if self.config.qos and self.published - self.acked() >= self.config.max_inflight:
            connection.wake.clear()
            try:
                await asyncio.wait_for(connection.wake.wait(), IO_TIMEOUT_S)
            except TimeoutError:
                raise PerfError(f"no PUBACK from the broker in {IO_TIMEOUT_S:.0f} s") from None
            self.report()
            return
        # Rate limited: sleep until the next message is due, but look at stop often.
        due_s = (self.published + 1) / self.config.publish_rate
        await asyncio.sleep(min(POLL_S, max(0.0, due_s - (time.monotonic() - self.started))))

    async def finish(self) -> None:
        """Wait for the outstanding PUBACKs."""
        connection = self.connection
        deadline = time.monotonic() + IO_TIMEOUT_S
        while self.config.qos and self.acked() < self.published:
            connection.check(f"publisher {self.index}")
            if time.monotonic() > deadline:
                raise PerfError(f"timed out waiting for {self.published - self.acked()} PUBACKs")
            connection.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(connection.wake.wait(), POLL_S)
        self.report()

    def report(self) -> None:
        confirmed = self.acked() if self.config.qos else self.published
        self.shared.set_published(self.index, self.published, confirmed)


class Consumer:
    """Counts one connection's deliveries and acknowledges them, from its read handler."""

    def __init__(
        self, config: MqttThroughputConfig, shared: Shared, index: int, c: PerfConnection
    ) -> None:
        self.config = config
        self.shared = shared
        self.index = index
        self.connection = c
        self.consumed = 0
        self.acks = 0
        self.started = time.monotonic()
        self.last_read = self.started
        c.on_read = self.on_read
        self.on_read(c)  # what arrived before the start

    def start_clock(self) -> None:
        """The run starts now: `-R`'s deliveries are due from here (the wait for the
        other workers to connect earned none: a full-suite run counted 152 at `-R 50` in 3 s)."""
        self.started = self.last_read = time.monotonic()

    def on_read(self, connection: PerfConnection) -> None:
        incoming = connection.incoming
        if incoming.bad_bodies:
            connection.fail(PerfError(f"consumer {self.index}: a body differs (-V)"))
            return
        if incoming.packet_ids:
            connection.write(pubacks(incoming.packet_ids))
            self.acks += len(incoming.packet_ids)
            incoming.packet_ids.clear()
        count, incoming.publishes = incoming.publishes, 0
        if count:
            self.last_read = time.monotonic()
            self.consumed += self.shared.claim_consumes(count)
            self.shared.set_consumed(self.index, self.consumed, self.acks)
        if self.config.consume_rate:
            self.hold_to_rate(connection)

    def hold_to_rate(self, connection: PerfConnection) -> None:
        """Count no delivery before it is due at `-R`: what a read brings beyond that
        waits, unscanned and unacknowledged, with the socket unread, until it is due."""
        connection.publishes_max = self.allowance()
        transport = connection.transport
        if connection.publishes_max or transport is None or connection.closed:
            return
        transport.pause_reading()
        wait_s = (self.consumed + 1) / self.config.consume_rate - (time.monotonic() - self.started)
        asyncio.get_running_loop().call_later(max(wait_s, 0.0), self.resume, connection)

    def allowance(self) -> int:
        """Deliveries due at `-R` and not counted yet."""
        due = int(self.config.consume_rate * (time.monotonic() - self.started)) + 1
        return max(0, due - self.consumed)

    def resume(self, connection: PerfConnection) -> None:
        """Take what waited (`on_read` holds again if that reaches the rate), then read
        again unless held."""
        transport = connection.transport
        if transport is None or transport.is_closing():
            return
        connection.publishes_max = self.allowance()
        connection.data_received(b"")
        if connection.publishes_max and not transport.is_closing():
            transport.resume_reading()


async def consume_until_done(
    config: MqttThroughputConfig, shared: Shared, consumers: list[Consumer]
) -> None:
    """The consumers work in their read handlers; this looks at the stop flag, the
    budget and the connections. Raises `PerfError` for a failed connection, or when a
    `-D` budget sees no delivery for IDLE_TIMEOUT_S."""
    while not shared.stopping() and shared.consumes_left():
        for consumer in consumers:
            consumer.connection.check(f"consumer {consumer.index}")
        last = max(consumer.last_read for consumer in consumers)
        if config.consume_max and time.monotonic() - last > IDLE_TIMEOUT_S:
            raise PerfError(f"no delivery for {IDLE_TIMEOUT_S:.0f} s")
        await asyncio.sleep(POLL_S)
