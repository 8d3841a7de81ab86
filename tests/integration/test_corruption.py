"""Damage placed by the test in a stopped (or running) broker's files: a damaged record of
a segment log (bit rot) is lost alone, reported and skipped by consumers, and its queue
or stream goes on; a damaged journal or definitions file fails only what needs it (404
with the reason, deletable, or 530 for the vhost); the rest of the broker keeps running.
More bit rot: test_bit_rot.py and test_bit_rot_random.py."""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from streamq.broker.accounts import AccountStore
from streamq.broker.vhost import MESSAGE_LOG_CONFIG
from streamq.queues.stream import TAIL_RECORDS_MAX
from tests.integration.conftest import RunningBroker, broker_on, drain_bodies

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


def test_a_damaged_record_in_a_scanned_stream_segment_is_lost_alone(
    broker: RunningBroker,
) -> None:
    """Without its index the closed segment is scanned at start: the damaged record is
    found then, lost alone and reported; a consumer from `first` gets every other one."""
    fill(broker)
    broker.stop()
    [stream_dir] = [p for p in (broker.data_dir / "vhosts").glob("*/streams/*") if p.is_dir()]
    first_segment = sorted(stream_dir.glob("*.seg"))[0]
    (stream_dir / first_segment.name.replace(".seg", ".idx")).unlink()  # force a scan
    flip_byte(first_segment, 200)  # inside an early record of a closed segment
    with broker_on(broker.data_dir) as restarted:
        bodies = consume_stream_bodies(restarted, 99)
        assert len(bodies) == 99
        assert bodies == [b for b in expected_stream() if b in bodies]  # intact, in order
        assert damaged_messages(restarted, "events") == 1
        conn = connect(restarted)
        method, _, body = conn.channel().basic_get("jobs", auto_ack=True)
        assert method is not None and body == b"jobs-0"  # the rest works
        conn.close()


def expected_stream() -> list[bytes]:
    return [f"{n:04d}".encode() + b"." * 100 for n in range(100)]


def consume_stream_bodies(broker: RunningBroker, count: int) -> list[bytes]:
    """`count` messages of the stream `events` from `first` (and no cancel meanwhile)."""
    conn = connect(broker)
    channel = conn.channel()
    channel.basic_qos(prefetch_count=50)
    bodies: list[bytes] = []
    cancelled: list[object] = []
    channel.add_on_cancel_callback(cancelled.append)

    def on_message(ch: object, method: pika.spec.Basic.Deliver, _p: object, body: bytes) -> None:
        bodies.append(body)
        channel.basic_ack(method.delivery_tag)

    channel.basic_consume("events", on_message, arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + TIMEOUT_S
    while len(bodies) < count and not cancelled and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=0.2)  # nothing more comes
    conn.close()
    assert not cancelled, "the consumer was cancelled"
    return bodies


def damaged_messages(broker: RunningBroker, queue: str) -> int:
    status, body, _ = broker.http("GET", f"/api/queues/%2F/{queue}")
    assert status == 200 and isinstance(body, dict)
    return int(body["damaged_messages"])


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


def test_a_stream_segment_damaged_while_running_loses_that_record_only(
    broker: RunningBroker,
) -> None:
    """Damage in a sealed segment of a running broker is found when a consumer reads it:
    that record is passed over and reported, the consumer is not cancelled."""
    fill(broker)
    conn = connect(broker)
    channel = conn.channel()
    # A stream serves its newest appends from memory (stream.TAIL_RECORDS_MAX): push the
    # first segment out of that window, so that reading from `first` reads the disk.
    channel.confirm_delivery()
    more = TAIL_RECORDS_MAX + 100
    for n in range(more):
        channel.basic_publish("", "events", f"more-{n}".encode())
    conn.close()
    [stream_dir] = [p for p in (broker.data_dir / "vhosts").glob("*/streams/*") if p.is_dir()]
    flip_byte(sorted(stream_dir.glob("*.seg"))[0], 200)
    bodies = consume_stream_bodies(broker, 100 + more - 1)
    assert len(bodies) == 100 + more - 1
    assert bodies[:99] == [b for b in expected_stream() if b in bodies[:99]]
    assert damaged_messages(broker, "events") == 1
    conn = connect(broker)
    method, _, body = conn.channel().basic_get("jobs", auto_ack=True)
    assert method is not None and body == b"jobs-0"
    conn.close()


def test_a_damaged_message_in_a_sealed_segment_of_the_shared_log_is_lost_alone(
    broker: RunningBroker,
) -> None:
    """Classic queues share their vhost's log and read their messages from it when they
    deliver them (a restart reads none: docs/durability.md). A byte flipped in its first
    (sealed) segment is found when that message is read: it is dropped from its queue
    and reported, the messages before and after it arrive intact, and the queue goes on."""
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("early", durable=True)
    channel.queue_declare("late", durable=True)
    channel.confirm_delivery()
    segment_mib = MESSAGE_LOG_CONFIG.segment_bytes_max >> 20
    for n in range(segment_mib):  # the first segment holds all but the last of them
        channel.basic_publish("", "early", bytes([n]) * (1 << 20))
    for _ in range(6):  # all in the second segment
        channel.basic_publish("", "late", b"m" * (1 << 20))
    conn.close()
    broker.stop()
    [messages_dir] = list((broker.data_dir / "vhosts").glob("*/messages"))
    segments = sorted(messages_dir.glob("*.seg"))
    assert len(segments) >= 2
    flip_byte(segments[0], 3 << 20)  # in the third message of "early" (1 MiB each)
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        channel = conn.channel()
        bodies = drain_bodies(channel, "early")
        assert [b[0] for b in bodies] == [n for n in range(segment_mib) if n != 2]
        assert all(b == bytes([b[0]]) * (1 << 20) for b in bodies)
        assert damaged_messages(restarted, "early") == 1
        assert damaged_messages(restarted, "late") == 0
        assert channel.queue_declare("late", passive=True).method.message_count == 6
        channel.basic_publish("", "early", b"new")
        assert channel.basic_get("early", auto_ack=True)[2] == b"new"
        conn.close()


def test_a_consumer_of_a_damaged_message_gets_every_other_one(broker: RunningBroker) -> None:
    """Deliveries read records in runs: the run stops before the damaged record, which
    is dropped from the queue (never delivered, counted), and the next run goes on after
    it; the consumer is not cancelled."""
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("jobs", durable=True)
    channel.confirm_delivery()
    sent = [f"{n:04d}".encode() * 256 for n in range(200)]  # 1 KiB each
    for body in sent:
        channel.basic_publish("", "jobs", body)
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
        while len(received) < 199 and not cancelled and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        conn.process_data_events(time_limit=0.2)
        assert not cancelled, f"the consumer was cancelled ({len(received)} received)"
        assert len(received) == 199
        [lost] = [n for n, body in enumerate(sent) if body not in received]
        assert 90 <= lost < 100
        assert received == sent[:lost] + sent[lost + 1 :]
        conn.close()
        assert damaged_messages(restarted, "jobs") == 1
        status, text, _ = restarted.http("GET", "/metrics")
        assert status == 200 and 'streamq_damaged_records_total{vhost="/"} 1' in str(text)
