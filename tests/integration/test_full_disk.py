"""A full disk is survived: publishers are blocked, confirms are held, consumers go on,
and once space returns everything resumes by itself, with no restart.

Method: `streamq serve --disk-free-limit 1MiB` as a child process, its data directory on
an 80 MB tmpfs mounted for the test, a 16 MiB filler file created there first. An
aio-pika publisher keeps a window of confirmed publishes of 64 KiB open, faster than the
200 ms alarm check can stop it, so that the log's writes overrun the limit and find the
file system full. The test checks that the publisher is blocked (management API), that
some confirms are held, that a consumer still gets and acks messages; then it deletes the
filler and checks that the held confirms come, publishing resumes, and every confirmed
message is in the queue; then SIGKILL and a restart keep every confirmed message.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import time
from pathlib import Path

import aio_pika

from tests.integration.broker_process import BrokerProcess
from tests.small_fs import small_filesystem

TIMEOUT_S = 30
QUEUE = "full"
BODY_BYTES = 64 * 1024
WINDOW = 64  # publishes in flight, unconfirmed
PUBLISHES_MAX = 4000  # 250 MB: far past the 80 MB file system, which must fill first
FILLER_BYTES = 16 << 20


def body(n: int) -> bytes:
    head = f"{n}:".encode()
    return head + bytes([n % 251]) * (BODY_BYTES - len(head))


def number(payload: bytes) -> int:
    head, _, rest = payload.partition(b":")
    n = int(head)
    assert rest == bytes([n % 251]) * len(rest), f"message {n} is damaged"
    return n


def api(broker: BrokerProcess, path: str) -> object:
    connection = http.client.HTTPConnection("127.0.0.1", broker.http_port, timeout=TIMEOUT_S)
    auth = base64.b64encode(b"guest:guest").decode()
    try:
        connection.request("GET", path, headers={"Authorization": f"Basic {auth}"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        return json.loads(response.read())
    finally:
        connection.close()


async def blocked_connections(broker: BrokerProcess) -> int:
    found = await asyncio.to_thread(api, broker, "/api/connections")
    assert isinstance(found, list)
    return sum(1 for c in found if c["state"] == "blocked")


async def disk_alarm(broker: BrokerProcess) -> bool:
    nodes = await asyncio.to_thread(api, broker, "/api/nodes")
    assert isinstance(nodes, list)
    return bool(nodes[0]["disk_free_alarm"])


class Publisher:
    """Publishes numbered messages with confirms, `WINDOW` at a time."""

    def __init__(self, channel: aio_pika.abc.AbstractChannel) -> None:
        self.channel = channel
        self.sent = 0
        self.confirmed: set[int] = set()
        self.pending: set[asyncio.Task[None]] = set()

    def fill_window(self) -> None:
        while len(self.pending) < WINDOW and self.sent < PUBLISHES_MAX:
            task = asyncio.ensure_future(self._publish(self.sent))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)
            self.sent += 1

    async def _publish(self, n: int) -> None:
        message = aio_pika.Message(body(n), delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await self.channel.default_exchange.publish(message, QUEUE, timeout=None)
        self.confirmed.add(n)


async def until(check: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        assert callable(check)
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def get_all(channel: aio_pika.abc.AbstractChannel, *, ack: bool) -> list[int]:
    """Every message the queue holds now (unacked ones go back when the channel closes)."""
    queue = await channel.get_queue(QUEUE)
    got = []
    while (message := await queue.get(fail=False, timeout=TIMEOUT_S)) is not None:
        got.append(number(message.body))
        if ack:
            await message.ack()
    return got


async def fill_and_recover(broker: BrokerProcess, filler: Path) -> tuple[set[int], set[int]]:
    """The run up to the SIGKILL: returns the confirmed messages and those acked."""
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    publishing = await aio_pika.connect(url, timeout=TIMEOUT_S)
    consuming = await aio_pika.connect(url, timeout=TIMEOUT_S)
    channel = await publishing.channel(publisher_confirms=True)
    await channel.declare_queue(QUEUE, durable=True)
    publisher = Publisher(channel)
    deadline = time.monotonic() + TIMEOUT_S
    while not await blocked_connections(broker):
        assert time.monotonic() < deadline, "the publisher was never blocked"
        assert publisher.sent < PUBLISHES_MAX, "the disk never filled"
        publisher.fill_window()
        await asyncio.wait(publisher.pending, timeout=0.05)

    # Blocked: nothing more is read from the publisher, and the confirms of what the
    # log could not write are held (never sent before the bytes are on disk).
    await asyncio.sleep(1.5)
    assert await blocked_connections(broker) == 1 and await disk_alarm(broker)
    held = publisher.sent - len(publisher.confirmed)
    assert held > 0, "no confirm held: the log never ran out of space"
    confirmed_while_blocked = set(publisher.confirmed)

    # Consumers go on: deliveries and acks work on a full disk.
    consumer = await consuming.channel()
    queue = await consumer.get_queue(QUEUE)
    acked = set()
    for _ in range(20):
        message = await queue.get(timeout=TIMEOUT_S)
        acked.add(number(message.body))
        await message.ack()
    assert await blocked_connections(broker) == 1

    # Room again: the held confirms come, the alarm clears, publishing resumes.
    filler.unlink()
    await until(lambda: not publisher.pending, "the held confirms")
    assert confirmed_while_blocked <= publisher.confirmed
    await until(lambda: _not(blocked_connections(broker)), "the publisher to be unblocked")
    assert not await disk_alarm(broker)
    resumed_from = publisher.sent
    for n in range(resumed_from, resumed_from + 50):
        await channel.default_exchange.publish(
            aio_pika.Message(body(n), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            QUEUE,
            timeout=TIMEOUT_S,
        )
        publisher.confirmed.add(n)
    # Every confirmed message is in the queue (taken without acks: they go back).
    scanning = await consuming.channel()
    seen = await get_all(scanning, ack=False)
    assert len(seen) == len(set(seen))
    assert publisher.confirmed - acked <= set(seen)
    await scanning.close()
    await consuming.close()
    await publishing.close()
    return publisher.confirmed, acked


async def _not(check: object) -> bool:
    assert asyncio.iscoroutine(check)
    return not await check


async def after_restart(broker: BrokerProcess) -> list[int]:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    try:
        return await get_all(await connection.channel(), ack=True)
    finally:
        await connection.close()


def test_a_full_disk_blocks_publishers_and_resumes_without_a_restart(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "fs", "80m") as fs:
        filler = fs / "filler"
        filler.write_bytes(bytes(FILLER_BYTES))
        data_dir = fs / "data"
        broker = BrokerProcess(data_dir, "--disk-free-limit", "1MiB")
        try:
            confirmed, acked = asyncio.run(
                asyncio.wait_for(fill_and_recover(broker, filler), 4 * TIMEOUT_S)
            )
        finally:
            broker.kill()
        log = broker.stderr.decode(errors="replace")
        assert log.count("out of disk space") == 1, log
        assert log.count("writes resumed") == 1, log
        assert "has failed" not in log and "housekeeping failed" not in log, log
        again = BrokerProcess(data_dir)
        try:
            restored = asyncio.run(asyncio.wait_for(after_restart(again), 2 * TIMEOUT_S))
        finally:
            again.stop()
        assert len(restored) == len(set(restored))
        assert confirmed - acked <= set(restored)
