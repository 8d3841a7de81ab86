"""What real clients trip over at the end of a connection (issue 29, item 7): the
broker's close-ok is not the end of what the client sends. Publishes queued behind a
client's connection.close (amqplib writes a channel's buffered frames after the close)
arrive after the close-ok; RabbitMQ reads and discards them until the client hangs up,
so the client reads its close-ok and its close() returns. A broker that closed the
socket at once reset the connection under them (EPIPE/ECONNRESET, close() never
returned). The stream protocol's quirks are in tests/stream/test_client_quirks.py (the
session's RabbitMQ runs no stream plugin)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pika
import pika.exceptions

from amqp_gateway.codec import methods as m
from tests.differential.harness import REPLY_TIMEOUT_S, Session, scenario
from tests.differential.wire import Closed, Silence, WireClient
from tests.node_clients import installed, run_script

AMQPLIB_DIR = Path(__file__).parents[2] / "integration" / "amqplib"
NODE_TIMEOUT_S = 60
PUBLISHES_BEHIND_CLOSE = 200
SEGMENT_SIZES = (1000, 0, 4095, 4096, -1, "1000", 3_000_000_000, 3_000_000_001, 4_000_000_000)
# How long the socket must stay open after close-ok while the client sends on: well under
# both brokers' bounds (RabbitMQ 30 s, streamq CLOSED_LINGER_S).
OPEN_AFTER_CLOSE_OK_S = 1.0


def stays_open(s: Session, conn_index: int, seconds: float) -> str:
    client = s.conns[conn_index].client
    try:
        return sends_on(client, s.name(), seconds)
    finally:
        client.closed = True  # the connection is over: the session does not close it


def sends_on(client: WireClient, queue: str, seconds: float) -> str:
    """What the broker did within `seconds` while we kept sending publishes: "open" if
    it neither closed nor reset the socket, else what happened."""
    publish = m.BasicPublish(exchange="", routing_key=queue)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        client.closed = False  # the close-ok set it; a failed send sets it again
        client.send_content(1, publish, b"late")
        if client.closed:
            return "send failed"
        try:
            client.read(0.05)
        except Silence:
            continue
        except Closed:
            return "closed"
        return "frame after close-ok"
    return "open"


@scenario("client_quirks.publishes_behind_close_are_discarded")
def publishes_behind_close(s: Session) -> None:
    """connection.close, then publishes pipelined behind it and more after the close-ok:
    the close-ok comes, and the socket stays open, reading, until the client hangs up."""
    conn = s.channel()
    conn.call(1, m.QueueDeclare(queue=s.name(), auto_delete=False))
    conn.client.send(0, m.ConnectionClose(reply_code=200, reply_text="bye"))
    for _ in range(PUBLISHES_BEHIND_CLOSE):
        conn.publish(1, "", s.name(), b"queued behind close")
    try:
        s.record("reply", conn.client.read(REPLY_TIMEOUT_S)[2])
    except (Silence, Closed) as exc:
        s.record("reply", type(exc).__name__)
    s.record("after close-ok", stays_open(s, 0, OPEN_AFTER_CLOSE_OK_S))
    # The publishes behind the close were discarded: the queue holds none of them.
    other = s.pika()
    declared = other.channel().queue_declare(s.name(), passive=True)
    s.record("queued", declared.method.message_count)
    other.channel().queue_delete(s.name())


def amqplib_installed() -> Path:
    return installed(AMQPLIB_DIR, "amqplib") / "close_queued.js"


@scenario("client_quirks.amqplib_close_with_publishes_queued")
def amqplib_close_with_publishes_queued(s: Session) -> None:
    """amqplib: a few thousand 64 KiB publishes buffered, then connection.close(): it
    returns, with no socket error."""
    script = amqplib_installed()
    done = run_script(script, str(s.endpoint.amqp_port), s.name(), timeout=NODE_TIMEOUT_S)
    s.record("exit", done.returncode, done.stderr[-300:] if done.returncode else "")
    if done.returncode == 0:
        result = json.loads(done.stdout)
        s.record("close()", result["outcome"], result["errors"], result["refused"] > 0)
    other = s.pika()
    other.channel().queue_delete(s.name())


@scenario("client_quirks.stream_small_max_segment_size")
def stream_small_max_segment_size(s: Session) -> None:
    """A stream with a small x-stream-max-segment-size-bytes (1,000, 0) is accepted, as
    RabbitMQ accepts it (streamq rounds it up to its minimum); a negative one is not."""
    for index, value in enumerate(SEGMENT_SIZES):
        channel = s.pika().channel()
        name = s.name(f"s{index}")
        arguments = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": value}
        try:
            channel.queue_declare(name, durable=True, arguments=arguments)
        except pika.exceptions.ChannelClosedByBroker as exc:
            s.record(value, exc.reply_code, exc.reply_text)
            continue
        s.record(value, "declare-ok")
        channel.queue_delete(name)
