"""The load generator's batch writes (streamq/perf/client.py) over a real socket pair
whose far end stops reading, as a broker under flow control does."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from streamq.perf import client as client_module
from streamq.perf.client import AmqpClient
from streamq.perf.errors import PerfError

BATCH = b"x" * (32 << 20)  # far more than the two socket buffers hold


def stalled_pair() -> tuple[AmqpClient, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.settimeout(10.0)
    return AmqpClient(ours, 4096), theirs


def test_a_batch_waits_for_a_broker_that_reads_again() -> None:
    client, broker = stalled_pair()
    received = bytearray()

    def read_late() -> None:
        time.sleep(0.3)  # longer than one poll: the writer must wait, not fail
        while len(received) < len(BATCH):
            received.extend(broker.recv(1 << 20))

    reader = threading.Thread(target=read_late)
    reader.start()
    assert client.send_batch(BATCH, lambda: False)
    reader.join(10)
    assert bytes(received) == BATCH
    client.abort()
    broker.close()


def test_a_stop_ends_a_batch_the_broker_does_not_read() -> None:
    client, broker = stalled_pair()
    stop_at = time.monotonic() + 0.3
    started = time.monotonic()
    assert not client.send_batch(BATCH, lambda: time.monotonic() > stop_at)
    assert time.monotonic() - started < 2.0
    client.abort()
    broker.close()


def test_a_broker_that_reads_nothing_for_the_stall_limit_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_module, "PUBLISH_STALL_S", 0.3)
    client, broker = stalled_pair()
    with pytest.raises(PerfError, match=r"the broker read nothing for 0\.3 s"):
        client.send_batch(BATCH, lambda: False)
    client.abort()
    broker.close()
