"""Segment writes with and without direct I/O, through `streamq serve` as a user runs it:
a confirmed message is on disk either way and survives SIGKILL; with direct I/O the
message log's active segment is padded to a 4 KiB block while the broker runs (recovery
cuts the padding), with --no-direct-io it ends at its last record."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from tests.integration.broker_process import BrokerProcess
from tests.integration.conftest import publish_persistent

BODY = b"d" * 1000


def active_segment(data_dir: Path) -> Path:
    return sorted(data_dir.glob("vhosts/*/messages/*.seg"))[-1]


@pytest.mark.parametrize(("options", "padded"), [((), True), (("--no-direct-io",), False)])
def test_a_confirmed_message_survives_sigkill_with_either_write_path(
    tmp_path: Path, options: tuple[str, ...], padded: bool
) -> None:
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir, *options)
    try:
        publish_persistent(broker.amqp_port, "direct", [BODY])
        size = active_segment(data_dir).stat().st_size
        assert (size % 4096 == 0) is padded
        assert active_segment(data_dir).read_bytes().endswith(BODY) is not padded
    finally:
        broker.kill()
    restarted = BrokerProcess(data_dir)
    try:
        connection = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", restarted.amqp_port)
        )
        method, _, body = connection.channel().basic_get("direct", auto_ack=True)
        assert method is not None and body == BODY
        connection.close()
        assert active_segment(data_dir).read_bytes().endswith(BODY)  # the padding was cut
    finally:
        restarted.stop()
