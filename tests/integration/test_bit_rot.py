"""Bit rot in a stopped broker's segment logs: a damaged record is lost alone, reported
(`damaged_messages`, the metric) and never delivered; every confirmed message after it is
kept. A torn tail (nothing valid after the bad bytes) is still cut, and reported as no
damage. The issue's two cases: a flip in the newest segment (found at recovery) and in a
sealed one (found when a consumer reads it), for a classic queue over the vhost's log
and for a stream read over AMQP. The stream protocol: tests/stream/test_rstream_bit_rot.py;
random flips in every segment and index file: test_bit_rot_random.py."""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pytest

from streamq.log import format as fmt
from tests.integration.bit_rot import (
    damaged_messages,
    damaged_metric,
    flip_in_body,
    messages_dir,
    record_spans,
    stream_dir,
)
from tests.integration.conftest import RunningBroker, broker_on

TIMEOUT_S = 20
COUNT = 2000
SMALL_STREAM = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 16384}


def body(n: int) -> bytes:
    return f"message-{n:06d}.".encode() * 4


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def publish(broker: RunningBroker, queue: str, count: int, arguments: dict[str, object]) -> None:
    """`count` confirmed messages to a durable `queue` (one confirm each: every one was
    confirmed before the broker stops)."""
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare(queue, durable=True, arguments=arguments)
    channel.confirm_delivery()
    for n in range(count):
        channel.basic_publish("", queue, body(n), pika.BasicProperties(delivery_mode=2))
    conn.close()


def consume(broker: RunningBroker, queue: str, count: int, stream: bool = False) -> list[bytes]:
    """What a consumer with acks receives from `queue` (a stream from `first`) until
    `count` came or nothing more comes; fails if it is cancelled."""
    conn = connect(broker)
    channel = conn.channel()
    channel.basic_qos(prefetch_count=100)
    received: list[bytes] = []
    cancelled: list[object] = []
    channel.add_on_cancel_callback(cancelled.append)

    def on_message(_ch: object, method: pika.spec.Basic.Deliver, _p: object, data: bytes) -> None:
        received.append(data)
        channel.basic_ack(method.delivery_tag)

    arguments = {"x-stream-offset": "first"} if stream else None
    channel.basic_consume(queue, on_message, arguments=arguments)
    deadline = time.monotonic() + TIMEOUT_S
    while len(received) < count and not cancelled and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=0.3)  # nothing more comes
    conn.close()
    assert not cancelled, f"the consumer was cancelled after {len(received)} messages"
    return received


@pytest.mark.parametrize("kind", ["classic", "stream"])
def test_a_flipped_bit_in_the_newest_segment_loses_that_message_only(
    tmp_path: Path, kind: str
) -> None:
    """The issue's first case: 2,000 confirmed, one bit flipped in message 1,000 of the
    newest segment. Recovery used to cut the segment there (1,000 survived); now the
    damaged record alone is lost, and reported."""
    stream = kind == "stream"
    arguments = SMALL_STREAM if stream else {}
    running = RunningBroker(tmp_path / "data")
    publish(running, "q", COUNT, arguments)
    running.stop()
    log_dir = stream_dir(tmp_path / "data") if stream else messages_dir(tmp_path / "data")
    spans = record_spans(log_dir)
    if stream:  # the newest segment: a stream with small segments has many
        spans = [s for s in spans if s.path == spans[-1].path]
    target = spans[len(spans) // 2]
    assert target.path == sorted(log_dir.glob("*.seg"))[-1]
    flip_in_body(target)
    lost = target.body
    with broker_on(tmp_path / "data") as restarted:
        received = consume(restarted, "q", COUNT - 1, stream)
        assert received == [body(n) for n in range(COUNT) if body(n) != lost]
        assert damaged_messages(restarted, "q") == 1
        assert damaged_metric(restarted) == 1
        conn = connect(restarted)
        conn.channel().basic_publish("", "q", b"after")  # the log goes on
        conn.close()
        assert consume(restarted, "q", COUNT, stream)[-1] == b"after"


def test_a_flipped_bit_in_a_sealed_stream_segment_loses_that_message_only(
    tmp_path: Path,
) -> None:
    """The issue's second case, for a stream: the sealed segment is trusted at start (its
    index checks), the damage is found when the consumer reads it; the consumer is not
    cancelled, the stream does not fail, every other message arrives."""
    running = RunningBroker(tmp_path / "data")
    publish(running, "events", COUNT, SMALL_STREAM)
    running.stop()
    spans = record_spans(stream_dir(tmp_path / "data"))
    sealed = [s for s in spans if s.path == spans[0].path]
    target = sealed[len(sealed) // 2]
    flip_in_body(target)
    with broker_on(tmp_path / "data") as restarted:
        received = consume(restarted, "events", COUNT - 1, stream=True)
        assert received == [body(n) for n in range(COUNT) if body(n) != target.body]
        assert damaged_messages(restarted, "events") == 1
        status, queue, _ = restarted.http("GET", "/api/queues/%2F/events")
        assert status == 200 and isinstance(queue, dict) and queue["state"] == "running"


def test_a_torn_tail_is_still_cut_and_is_no_damage(tmp_path: Path) -> None:
    """A write cut by a crash leaves part of a record at the end, past the durable marker:
    nothing valid follows, so it is a torn tail. It is cut (the file is as before), no
    damage is reported, every confirmed message is there and the next append reuses the
    torn record's offset."""
    running = RunningBroker(tmp_path / "data")
    publish(running, "jobs", 50, {})
    running.stop()
    log_dir = messages_dir(tmp_path / "data")
    spans = record_spans(log_dir)
    newest = spans[-1].path
    size = newest.stat().st_size
    torn = fmt.encode_record_parts(spans[-1].offset + 1, 1, b"", b"jobs", b"", b"x" * 300)
    with open(newest, "ab") as f:
        f.write(torn[: len(torn) // 2])
    with broker_on(tmp_path / "data") as restarted:
        assert newest.stat().st_size == size
        assert consume(restarted, "jobs", 50) == [body(n) for n in range(50)]
        assert damaged_messages(restarted, "jobs") == 0
        assert damaged_metric(restarted) == 0


def test_a_tracked_stream_offset_moves_past_a_damaged_record(tmp_path: Path) -> None:
    """A consumer with automatic offset tracking that acks everything it gets: the
    damaged record, never delivered, counts as passed over (as a filtered-out one), so
    the offset stored reaches the last message, and a reconnect resumes after it."""
    running = RunningBroker(tmp_path / "data")
    publish(running, "events", 300, SMALL_STREAM)
    running.stop()
    spans = record_spans(stream_dir(tmp_path / "data"))
    sealed = [s for s in spans if s.path == spans[0].path]
    flip_in_body(sealed[len(sealed) // 2])
    with broker_on(tmp_path / "data") as restarted:
        conn = connect(restarted)
        channel = conn.channel()
        channel.basic_qos(prefetch_count=20)
        received: list[bytes] = []

        def on_message(
            _ch: object, method: pika.spec.Basic.Deliver, _p: object, data: bytes
        ) -> None:
            received.append(data)
            channel.basic_ack(method.delivery_tag)

        tracking = {"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True}
        channel.basic_consume("events", on_message, consumer_tag="reader", arguments=tracking)
        deadline = time.monotonic() + TIMEOUT_S
        while len(received) < 299 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        conn.close()
        assert len(received) == 299
        assert restarted.broker is not None
        vhost = restarted.broker.vhosts["/"]

        def stored() -> int | None:
            stream = vhost.queues["events"].stream
            return None if stream is None else stream.offsets.get("reader")

        deadline = time.monotonic() + TIMEOUT_S
        while restarted.ask(stored) != 299 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert restarted.ask(stored) == 299


def test_the_scrub_reports_damage_in_a_sealed_segment_nobody_reads(tmp_path: Path) -> None:
    """Start-up trusts sealed segments; the background scrub reads them and reports the
    damage (the API and the metric) without any consumer."""
    running = RunningBroker(tmp_path / "data")
    publish(running, "events", 500, SMALL_STREAM)
    running.stop()
    spans = record_spans(stream_dir(tmp_path / "data"))
    sealed = [s for s in spans if s.path == spans[0].path]
    flip_in_body(sealed[len(sealed) // 2])
    with broker_on(tmp_path / "data") as restarted:
        deadline = time.monotonic() + TIMEOUT_S
        while damaged_messages(restarted, "events") == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert damaged_messages(restarted, "events") == 1
        assert damaged_metric(restarted) == 1
