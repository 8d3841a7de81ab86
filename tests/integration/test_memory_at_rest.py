"""Memory at rest, end to end: a broker that received 40 MiB of messages nobody reads keeps
them on disk, not in its RSS, once the publishers stop (the log lets its in-memory tail go
and the freed memory goes back to the kernel), and delivers every one of them from the
files afterwards; a consumer reading right behind its publisher is served all the same.

Method: `streamq serve` in its own process with a 4 GiB watermark (a 32 MiB log tail,
whatever this host's RAM), pika with publisher confirms; its VmRSS read from /proc. The
broker before this change kept the 32 MiB (and what glibc held on to) for as long as it
ran: these assertions fail on it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.broker_process import BrokerProcess

MIB = 1 << 20
BODY_BYTES = 64 * 1024
MESSAGES = 640  # 40 MiB: more than the 32 MiB tail
REST_SLACK_BYTES = 12 * MIB  # above the RSS before publishing, once at rest
REST_TIMEOUT_S = 30.0
POLL_S = 0.2
TIMEOUT_S = 30


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _body(i: int) -> bytes:
    return i.to_bytes(4, "big") * (BODY_BYTES // 4)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    running = BrokerProcess(tmp_path / "data", "--memory-high-watermark", "4GiB")
    yield running
    assert running.stop() == 0


@pytest.fixture
def channel(broker: BrokerProcess) -> Iterator[BlockingChannel]:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            broker.amqp_port,
            socket_timeout=TIMEOUT_S,
            blocked_connection_timeout=TIMEOUT_S,
        )
    )
    opened = connection.channel()
    opened.confirm_delivery()
    yield opened
    connection.close()


def _publish(channel: BlockingChannel, queue: str, first: int, count: int) -> None:
    for i in range(first, first + count):
        channel.basic_publish("", queue, _body(i), pika.BasicProperties(delivery_mode=2))


def _wait_rss_at_most(pid: int, limit: int) -> int:
    deadline = time.monotonic() + REST_TIMEOUT_S
    while (rss := _rss_bytes(pid)) > limit:
        assert time.monotonic() < deadline, f"RSS {rss / MIB:.1f} MiB > {limit / MIB:.1f} MiB"
        time.sleep(POLL_S)
    return rss


def test_an_unread_backlog_leaves_memory_and_is_delivered_from_the_files(
    broker: BrokerProcess, channel: BlockingChannel
) -> None:
    pid = broker.process.pid
    channel.queue_declare("backlog", durable=True)
    _publish(channel, "backlog", 0, 1)
    before = _rss_bytes(pid)
    _publish(channel, "backlog", 1, MESSAGES - 1)
    _wait_rss_at_most(pid, before + REST_SLACK_BYTES)

    got = []
    for _ in range(MESSAGES):
        method, _, body = channel.basic_get("backlog", auto_ack=True)
        assert method is not None, f"only {len(got)} of {MESSAGES} came back"
        got.append(body)
    assert got == [_body(i) for i in range(MESSAGES)]


def test_a_consumer_behind_its_publisher_reads_everything_and_memory_settles(
    broker: BrokerProcess, channel: BlockingChannel
) -> None:
    pid = broker.process.pid
    channel.queue_declare("live", durable=True)
    _publish(channel, "live", 0, 1)
    assert channel.basic_get("live", auto_ack=True)[2] == _body(0)
    before = _rss_bytes(pid)
    got: list[bytes] = []
    for i in range(1, MESSAGES, 16):  # publish a little, read it back at once
        _publish(channel, "live", i, min(16, MESSAGES - i))
        while len(got) < min(i + 16, MESSAGES) - 1:
            method, _, body = channel.basic_get("live", auto_ack=True)
            assert method is not None
            got.append(body)
    assert got == [_body(i) for i in range(1, MESSAGES)]
    _wait_rss_at_most(pid, before + REST_SLACK_BYTES)
