"""At-least-once across SIGKILL: a shovel in on-confirm mode loses nothing when the source
broker, the destination broker or the broker that runs the shovel is killed in the middle
of a transfer and started again.

Method: numbered persistent messages are published under confirms to a durable queue of
`streamq serve` process S; the shovel moves them to a durable queue of process D on fixed
loopback ports (so that a restarted broker is where the shovel looks for it). Once part of
them arrived, one process is SIGKILLed and restarted on its data directory. When the source
queue is empty again, the destination must hold every number at least once; duplicates
(messages confirmed by D whose ack S never made durable) are counted and printed, and
bounded.
"""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from tests.integration.broker_process import RestartableBroker
from tests.integration.shovel_helpers import (
    amqp_uri,
    bodies_of,
    numbered,
    publish,
    put_shovel,
    queue_length,
    queue_messages,
    wait_length,
    wait_until,
)

MESSAGES = 2_000
PREFETCH = 1  # one at a time: the transfer takes long enough to be cut in the middle
# Duplicates: the prefetch window in flight, plus what the source acked but had not made
# durable when it died. Its queue journals are flushed every 0.2 s, which at a fast
# shovel's rate is thousands of acks; so the test makes a sync round (`sync_round`) just
# before the kill, and only the acks of the moments between come back. Half the messages
# again would be a bug.
DUPLICATES_MAX = MESSAGES // 2


def sync_round(port: int) -> None:
    """Returns after a sync round of the broker at `port`: the Declare-Ok of a new durable
    exchange waits for one (everything buffered before it is then durable)."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        connection.channel().exchange_declare("sync-round", "fanout", durable=True)
    finally:
        connection.close()


@pytest.mark.parametrize("killed", ["source", "destination", "runner"])
def test_sigkill_loses_nothing(tmp_path: Path, killed: str) -> None:
    source, dest = RestartableBroker(tmp_path / "s"), RestartableBroker(tmp_path / "d")
    try:
        publish(source.amqp_port, "src", numbered(MESSAGES))
        value: dict[str, object] = {
            "src-queue": "src",
            "dest-queue": "dst",
            "src-prefetch-count": PREFETCH,
            "ack-mode": "on-confirm",
            "reconnect-delay": 0.5,
        }
        if killed == "source":  # the shovel runs on D: S is only its source
            value.update({"src-uri": amqp_uri(source.amqp_port), "dest-uri": "amqp://"})
            put_shovel(dest.http_port, "move", value)
        else:  # the shovel runs on S, which is also its source
            value.update({"src-uri": "amqp://", "dest-uri": amqp_uri(dest.amqp_port)})
            put_shovel(source.http_port, "move", value)
        wait_length(dest.amqp_port, "dst", MESSAGES // 10)
        victim = dest if killed == "destination" else source
        assert queue_length(source.amqp_port, "src") > 0, "the transfer ended before the kill"
        sync_round(source.amqp_port)  # the acks so far durable: those after it come back
        victim.kill_and_restart()
        wait_until(lambda: queue_messages(source.http_port, "src") == 0, "the source emptied", 120)
        wait_length(dest.amqp_port, "dst", MESSAGES, 60)
        got = bodies_of(dest.amqp_port, "dst")
        duplicates = len(got) - len(set(got))
        print(f"killed {killed}: {len(got)} received, {duplicates} duplicates")
        assert set(got) == set(numbered(MESSAGES))  # every message arrived
        assert duplicates <= DUPLICATES_MAX
    finally:
        source.stop()
        dest.stop()
