"""Damage placed by the test in a stopped (or running) broker's files fails only what needs
the damaged file: the queue or stream (404 with the reason, deletable), or the vhost
(530 with the reason); the rest of the broker keeps running."""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from streamq.broker.accounts import AccountStore
from streamq.broker.vhost_store import MESSAGE_LOG_CONFIG
from streamq.queues.stream import TAIL_RECORDS_MAX
from tests.integration.conftest import RunningBroker, broker_on

TIMEOUT_S = 10
SMALL_STREAM = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}


def connect(broker: RunningBroker, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", broker.amqp_port, vhost, blocked_connection_timeout=TIMEOUT_S
        )
    )


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def fill(broker: RunningBroker) -> None:
    """A stream over several segments and two durable classic queues."""
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("events", durable=True, arguments=SMALL_STREAM)
    channel.queue_declare("jobs", durable=True)
    channel.queue_declare("other", durable=True)
    channel.confirm_delivery()
    for n in range(100):
        channel.basic_publish("", "events", f"{n:04d}".encode() + b"." * 100)
    for queue in ("jobs", "other"):
        for n in range(5):
            channel.basic_publish("", queue, f"{queue}-{n}".encode())
    conn.close()


def unavailable(broker: RunningBroker, action: object) -> pika.exceptions.ChannelClosedByBroker:
    conn = connect(broker)
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            action(conn.channel())  # type: ignore[operator]
    finally:
        if conn.is_open:
            conn.close()
    return closed.value


def consume_stream(channel: pika.adapters.blocking_connection.BlockingChannel) -> None:
    channel.basic_qos(prefetch_count=10)
    channel.basic_consume("events", lambda *a: None, arguments={"x-stream-offset": "first"})


def test_a_corrupt_stream_segment_fails_that_stream_only(broker: RunningBroker) -> None:
    fill(broker)
    broker.stop()
    [stream_dir] = [p for p in (broker.data_dir / "vhosts").glob("*/streams/*") if p.is_dir()]
    first_segment = sorted(stream_dir.glob("*.seg"))[0]
    (stream_dir / first_segment.name.replace(".seg", ".idx")).unlink()  # force a scan
    flip_byte(first_segment, 200)  # inside an early record of a closed segment
    with broker_on(broker.data_dir) as restarted:
        error = unavailable(restarted, consume_stream)
        assert error.reply_code == 404
        assert "queue 'events' in vhost '/' is unavailable" in error.reply_text
        conn = connect(restarted)
        channel = conn.channel()
        method, _, body = channel.basic_get("jobs", auto_ack=True)
        assert method is not None and body == b"jobs-0"  # the rest works
        channel.queue_delete("events")  # a failed queue can be deleted
        channel.queue_declare("events", durable=True, arguments=SMALL_STREAM)
        assert channel.queue_declare("events", passive=True).method.message_count == 0
        conn.close()


def test_a_corrupt_queue_journal_fails_that_queue_only(broker: RunningBroker) -> None:
    fill(broker)
    broker.stop()
    journals = sorted((broker.data_dir / "vhosts").glob("*/queues/*.journal"))
    assert len(journals) == 2
    flip_byte(journals[0], 16 + 8 + 3)  # in the first entry of the first of two blocks
    with broker_on(broker.data_dir) as restarted:
        results = {}
        for queue in ("jobs", "other"):
            conn = connect(restarted)
            try:
                _, _, body = conn.channel().basic_get(queue, auto_ack=True)
                results[queue] = body
                conn.close()
            except pika.exceptions.ChannelClosedByBroker as exc:
                results[queue] = exc.reply_code
        assert sorted(map(str, results.values())) == ["404", f"b'{_other(results)}-0'"]


def _other(results: dict[str, object]) -> str:
    return next(q for q, r in results.items() if r != 404)


def test_a_corrupt_definitions_file_fails_that_vhost_only(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    store = AccountStore.open(str(data_dir))
    store.add_vhost("broken")
    store.set_permissions("guest", "broken", ".*", ".*", ".*")
    running = RunningBroker(data_dir)
    conn = connect(running, "broken")
    for n in range(3):
        conn.channel().queue_declare(f"q{n}", durable=True)
    conn.close()
    running.stop()
    definitions = [
        p for p in (data_dir / "vhosts").glob("*/definitions") if b"q0" in p.read_bytes()
    ]
    flip_byte(definitions[0], 20)  # in the first record, followed by good ones
    with broker_on(data_dir) as restarted:
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
            connect(restarted, "broken")
        assert "vhost broken is unavailable" in str(refused.value)
        conn = connect(restarted)
        conn.channel().queue_declare("fine", durable=True)
        conn.close()


def test_a_stream_segment_damaged_while_running_cancels_its_consumers(
    broker: RunningBroker,
) -> None:
    fill(broker)
    conn = connect(broker)
    channel = conn.channel()
    # A stream serves its newest appends from memory (stream.TAIL_RECORDS_MAX): push the
    # first segment out of that window, so that reading from `first` reads the disk.
    channel.confirm_delivery()
    for n in range(TAIL_RECORDS_MAX + 100):
        channel.basic_publish("", "events", f"more-{n}".encode())
    [stream_dir] = [p for p in (broker.data_dir / "vhosts").glob("*/streams/*") if p.is_dir()]
    flip_byte(sorted(stream_dir.glob("*.seg"))[0], 200)
    channel = conn.channel()
    channel.basic_qos(prefetch_count=10)
    cancelled: list[object] = []
    channel.add_on_cancel_callback(cancelled.append)
    channel.basic_consume("events", lambda *a: None, arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + TIMEOUT_S
    while not cancelled and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert cancelled, "the consumer of the failed stream was not cancelled"
    method, _, body = conn.channel().basic_get("jobs", auto_ack=True)
    assert method is not None and body == b"jobs-0"
    conn.close()


def test_a_damaged_segment_of_the_shared_log_fails_only_the_queues_with_messages_in_it(
    broker: RunningBroker,
) -> None:
    """Classic queues share their vhost's log and read their messages from it when they
    deliver them (a restart reads none: docs/durability.md). A byte flipped in its first
    (sealed) segment fails the queue whose message is there when that message is read:
    the messages before it arrive intact, then 404 with the reason; a queue whose
    messages are all in later segments, and the vhost, go on."""
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("early", durable=True)
    channel.queue_declare("late", durable=True)
    channel.confirm_delivery()
    megabyte = b"m" * (1 << 20)
    segment_mib = MESSAGE_LOG_CONFIG.segment_bytes_max >> 20
    for _ in range(segment_mib):  # the first segment holds all but the last of them
        channel.basic_publish("", "early", megabyte)
    for _ in range(6):  # all in the second segment
        channel.basic_publish("", "late", megabyte)
    conn.close()
    broker.stop()
    [messages_dir] = list((broker.data_dir / "vhosts").glob("*/messages"))
    segments = sorted(messages_dir.glob("*.seg"))
    assert len(segments) >= 2
    flip_byte(segments[0], 3 << 20)  # in the third message of "early" (1 MiB each)
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        channel = conn.channel()
        bodies = [channel.basic_get("early", auto_ack=True)[2] for _ in range(2)]
        assert bodies == [megabyte, megabyte]
        conn.close()
        error = unavailable(restarted, lambda ch: ch.basic_get("early"))
        assert error.reply_code == 404
        assert "queue 'early' in vhost '/' is unavailable" in error.reply_text
        assert "checksum mismatch" in error.reply_text
        error = unavailable(restarted, lambda ch: ch.basic_get("early"))
        assert error.reply_code == 404  # failed for good, until deleted
        conn = connect(restarted)
        channel = conn.channel()
        assert channel.queue_declare("late", passive=True).method.message_count == 6
        method, _, body = channel.basic_get("late", auto_ack=True)
        assert method is not None and body == megabyte
        channel.queue_declare("fresh", durable=True)
        channel.basic_publish("", "fresh", b"new")
        assert channel.basic_get("fresh", auto_ack=True)[2] == b"new"
        conn.close()


def test_a_consumer_of_a_damaged_message_is_cancelled_and_gets_none_of_it(
    broker: RunningBroker,
) -> None:
    """Deliveries read records in runs: the run stops before the damaged record, so the
    consumer receives every message before it intact and none after; then its queue
    fails and the consumer is cancelled (consumer_cancel_notify)."""
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("jobs", durable=True)
    channel.confirm_delivery()
    for n in range(200):
        channel.basic_publish("", "jobs", f"{n:04d}".encode() * 256)  # 1 KiB each
    channel.queue_declare("filler", durable=True)
    megabyte = b"m" * (1 << 20)
    for _ in range(MESSAGE_LOG_CONFIG.segment_bytes_max >> 20):  # seals the first segment
        channel.basic_publish("", "filler", megabyte)
    conn.close()
    broker.stop()
    [messages_dir] = list((broker.data_dir / "vhosts").glob("*/messages"))
    segment = sorted(messages_dir.glob("*.seg"))[0]
    flip_byte(segment, 100 * 1024)  # about the 99th record
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        channel = conn.channel()
        received: list[bytes] = []
        cancelled: list[object] = []
        channel.add_on_cancel_callback(cancelled.append)
        channel.basic_consume(
            "jobs", lambda ch, method, props, body: received.append(body), auto_ack=True
        )
        deadline = time.monotonic() + TIMEOUT_S
        while not cancelled and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert cancelled, f"the consumer was not cancelled ({len(received)} received)"
        assert 90 <= len(received) < 100
        assert received == [f"{n:04d}".encode() * 256 for n in range(len(received))]
        conn.close()
        error = unavailable(restarted, lambda ch: ch.basic_get("jobs"))
        assert error.reply_code == 404 and "checksum mismatch" in error.reply_text
