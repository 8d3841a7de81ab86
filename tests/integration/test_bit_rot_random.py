"""Random bit rot: the rules of docs/durability.md ("Bit rot") hold wherever bits flip in
the segment and index files of a stopped broker.

Each cycle starts a broker on a fresh data directory, publishes confirmed messages to a
classic queue (the vhost's log) and to a stream with small segments (many sealed ones,
each with its index), stops it, flips 1 to `FLIPS_MAX` bits at random positions in
randomly chosen `.seg` and `.idx` files (the real bytes on disk), restarts it and
consumes everything. The records a flip landed in are known from the files' bytes
before the flips (the format module alone reads them). A stream's segments hold chunks
(format version 2, docs/log-format.md): a flip in an entry loses that record (its own
CRC32C in the trailer), a flip in a chunk's frame head, header, filter or trailer loses
the chunk's records. It asserts that every record no flip hit is delivered, in order,
and nothing else (no damaged body: every body delivered is one published, intact); and
that the damage each queue reports (`damaged_messages`, and the vhost's
`streamq_damaged_records_total`) is the number of records hit.

Bounded for `make test`: `STREAMQ_BIT_ROT_CYCLES` cycles (24 by default; set more for a
soak), seeded by `STREAMQ_BIT_ROT_SEED` (random by default, printed on failure).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pika
import pytest

from tests.integration.bit_rot import (
    ChunkSpan,
    RecordSpan,
    chunk_spans,
    damaged_messages,
    damaged_metric,
    flip_bit,
    messages_dir,
    record_spans,
    stream_dir,
)
from tests.integration.conftest import RunningBroker, broker_on

CYCLES = int(os.environ.get("STREAMQ_BIT_ROT_CYCLES", "24"))
SEED = int(os.environ.get("STREAMQ_BIT_ROT_SEED", str(random.randrange(1 << 32))))
FLIPS_MAX = 4
MESSAGES = 150  # per queue and cycle
TIMEOUT_S = 20
SMALL_STREAM = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def published(rng: random.Random, cycle: int) -> dict[str, list[bytes]]:
    """The bodies of a cycle, per queue: unique, of random sizes (so records straddle
    index intervals and segment ends differently each cycle)."""
    return {
        queue: [
            f"{queue}-{cycle}-{n:05d}-".encode() + bytes([65 + n % 26]) * rng.randrange(0, 400)
            for n in range(MESSAGES)
        ]
        for queue in ("jobs", "events")
    }


def publish(broker: RunningBroker, bodies: dict[str, list[bytes]], ttl: bool) -> None:
    """With `ttl`, the classic queue has a (long) message TTL: its deliveries then take
    the paths that read messages one at a time."""
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare(
        "jobs", durable=True, arguments={"x-message-ttl": 3_600_000} if ttl else {}
    )
    channel.queue_declare("events", durable=True, arguments=SMALL_STREAM)
    channel.confirm_delivery()  # each publish waits for its confirm
    for queue, sent in bodies.items():
        for body in sent:
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    conn.close()


def flip_randomly(rng: random.Random, data_dir: Path) -> list[tuple[Path, int]]:
    """Flip 1 to FLIPS_MAX bits of randomly chosen segment and index files (a file first,
    then a bit in it: the small index files are hit as often as the segments)."""
    candidates = [
        path
        for directory in (messages_dir(data_dir), stream_dir(data_dir))
        for path in sorted(directory.iterdir())
        if path.suffix in (".seg", ".idx") and path.stat().st_size > 0
    ]
    flips = []
    for _ in range(rng.randint(1, FLIPS_MAX)):
        path = rng.choice(candidates)
        bit = rng.randrange(path.stat().st_size * 8)
        flip_bit(path, bit)
        flips.append((path, bit // 8))
    return flips


def hit(spans: list[RecordSpan], flips: list[tuple[Path, int]]) -> set[bytes]:
    """The bodies of the records a flip landed in."""
    return {
        span.body
        for span in spans
        for path, byte in flips
        if path == span.path and span.position <= byte < span.end
    }


def chunk_frames_hit(
    chunks: list[ChunkSpan], flips: list[tuple[Path, int]], sent: list[bytes]
) -> set[bytes]:
    """The bodies of the records of the chunks a flip landed in outside their entries
    (the frame CRC32C fails: the whole chunk is lost; offset n holds message n)."""
    return {
        sent[offset]
        for span in chunks
        for path, byte in flips
        if path == span.path and span.position <= byte < span.end
        and not span.entries_at <= byte < span.entries_at + span.entries_bytes
        for offset in range(span.first_offset, span.first_offset + span.records)
    }  # fmt: skip


def consume(
    broker: RunningBroker, queue: str, count: int, by_get: bool, consumers: int = 1
) -> list[bytes]:
    """Everything `queue` delivers (a stream from `first`): by basic.get, or by
    `consumers` consumers with acks on one channel (round robin: the channel still
    receives in offset order) until `count` came and then nothing more for a moment."""
    conn = connect(broker)
    channel = conn.channel()
    received: list[bytes] = []
    if by_get:
        while (taken := channel.basic_get(queue, auto_ack=True))[0] is not None:
            received.append(taken[2])
        conn.close()
        return received
    channel.basic_qos(prefetch_count=rngless_prefetch(queue))
    cancelled: list[object] = []
    channel.add_on_cancel_callback(cancelled.append)

    def on_message(_ch: object, method: pika.spec.Basic.Deliver, _p: object, body: bytes) -> None:
        received.append(body)
        channel.basic_ack(method.delivery_tag)

    arguments = {"x-stream-offset": "first"} if queue == "events" else None
    for _ in range(consumers):
        channel.basic_consume(queue, on_message, arguments=arguments)
    deadline = time.monotonic() + TIMEOUT_S
    while len(received) < count and not cancelled and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=0.2)
    conn.close()
    assert not cancelled, f"the consumer of {queue} was cancelled"
    return received


def rngless_prefetch(queue: str) -> int:
    return 7 if queue == "jobs" else 50  # runs end inside the classic queue's damage too


@pytest.mark.parametrize("cycle", range(CYCLES))
def test_random_flips_lose_only_the_records_hit(tmp_path: Path, cycle: int) -> None:
    rng = random.Random(SEED * 1000 + cycle)
    context = f"seed {SEED} cycle {cycle} (STREAMQ_BIT_ROT_SEED={SEED} to repeat)"
    bodies = published(rng, cycle)
    data_dir = tmp_path / "data"
    ttl = rng.random() < 0.3
    running = RunningBroker(data_dir)
    publish(running, bodies, ttl)
    running.stop()
    spans = {
        "jobs": record_spans(messages_dir(data_dir)),
        "events": record_spans(stream_dir(data_dir)),
    }
    for queue, sent in bodies.items():
        assert [s.body for s in spans[queue]] == sent, context
    chunks = chunk_spans(stream_dir(data_dir))
    flips = flip_randomly(rng, data_dir)
    context += f", flips {[(p.name, b) for p, b in flips]}"
    print(context)  # shown with any failure, an exception in the broker's start included
    with broker_on(data_dir) as restarted:
        total = 0
        for queue, sent in bodies.items():
            lost = hit(spans[queue], flips)
            if queue == "events":
                lost |= chunk_frames_hit(chunks, flips, sent)
            expected = [body for body in sent if body not in lost]
            by_get = queue == "jobs" and rng.random() < 0.4
            consumers = rng.choice((1, 2)) if queue == "jobs" else 1
            received = consume(restarted, queue, len(expected), by_get, consumers)
            assert received == expected, f"{queue}: {context}, lost {len(lost)}"
            assert damaged_messages(restarted, queue) == len(lost), f"{queue}: {context}"
            total += len(lost)
        assert damaged_metric(restarted) == total, context
