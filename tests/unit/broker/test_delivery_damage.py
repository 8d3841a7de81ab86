"""Bit rot on the run delivery paths (`streamq.broker.delivery`): a record lost to damage
on disk is skipped and counted in the queue's `damaged_messages` (docs/durability.md,
"Bit rot") whichever way a round reads it. Here the round of a queue with TTLs checks a
run's messages for expiry (`unexpired_runs`) before the run goes out, with one consumer
or two taking one message each (a backlog under RUN_BACKLOG_MIN). The vhost is
driven directly: messages published, the vhost closed, a bit flipped in a record's body
on disk, the vhost opened again and its rounds run by hand while one is due."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_gateway.codec import BasicProperties, encode_properties
from amqp_gateway.deaths import AmqpPropertiesCodec
from streamq.broker.delivery import RUN_BACKLOG_MIN
from streamq.broker.vhost import VHost
from streamq.log import format as fmt
from streamq.log.syncer import Syncer
from tests.unit.broker.consumers import RecordingConsumer

PLAIN = encode_properties(BasicProperties())
LATER = encode_properties(BasicProperties(expiration="3600000"))
MESSAGES = 20  # under RUN_BACKLOG_MIN: two consumers take one message each per turn
DAMAGED = 7  # the message whose record gets a flipped bit
ROUNDS_MAX = 10  # drain rounds run by hand, at most


def open_vhost(directory: Path) -> VHost:
    host = VHost("/", str(directory), Syncer())
    host.properties_codec = AmqpPropertiesCodec()
    return host


def flip_in_body(directory: Path, offset: int) -> None:
    """Flip a bit in the middle of the body of the record at `offset` (the real bytes of
    the segment file)."""
    [path] = sorted(directory.glob("**/*" + fmt.SEGMENT_SUFFIX))
    data = bytearray(path.read_bytes())
    records: list[fmt.Record] = []
    position = fmt.SEGMENT_HEADER_BYTES
    while len(records) <= offset:
        result = fmt.decode_records(data, 0, position, len(records), offset + 1, records, 1, "")
        position = result.position
    end = position  # one past the record at `offset`
    data[end - len(records[offset].body) // 2] ^= 0x08
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("consumers", [1, 2])
@pytest.mark.parametrize("per_message", [False, True], ids=["queue-ttl", "expiration"])
def test_a_damaged_record_in_a_ttl_queue_is_skipped_and_counted(
    tmp_path: Path, consumers: int, per_message: bool
) -> None:
    """With the queue's TTL a run's first message is read for its expiry; with
    per-message expirations each of the run's messages is (the damaged one too)."""
    assert MESSAGES < RUN_BACKLOG_MIN
    directory = tmp_path / "vh"
    host = open_vhost(directory)
    try:
        arguments = {} if per_message else {"x-message-ttl": 3_600_000}
        queue = host.declare_queue("q", False, True, False, False, arguments, owner=None)
        for n in range(MESSAGES):
            host.publish("", "q", LATER if per_message else PLAIN, b"message %03d" % n, [queue])
    finally:
        host.close()
    flip_in_body(directory, DAMAGED)
    host = open_vhost(directory)
    try:
        queue = host.queues["q"]
        taking = [RecordingConsumer(0, tag=f"c{n}") for n in range(consumers)]
        for consumer in taking:
            host.add_consumer(queue, consumer)
        for _ in range(ROUNDS_MAX):  # as the event loop does, while a queue is due
            host.drain()
            if not host.schedule.dirty:
                break
        received = sorted(body for consumer in taking for body in consumer.bodies)
        assert received == [b"message %03d" % n for n in range(MESSAGES) if n != DAMAGED]
        assert queue.failed is None
        assert queue.cursor.damaged_messages == 1
        assert queue.cursor.message_count == 0
        assert queue.cursor.bytes_ready == 0
    finally:
        host.close()
