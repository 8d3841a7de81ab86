"""Stream queues over AMQP with unmodified pika: declaration rules, every x-stream-offset
form (across segment boundaries, with a small segment size), the offset header, many
consumers, prompt wake-up of caught-up consumers, redelivery, and a restart."""

from __future__ import annotations

import datetime
import time

import amqp
import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker, broker_on

TIMEOUT_S = 10
SMALL_SEGMENTS = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def declare_stream(channel: BlockingChannel, name: str, count: int = 0, size: int = 100) -> None:
    channel.queue_declare(name, durable=True, arguments=SMALL_SEGMENTS)
    channel.confirm_delivery()
    for n in range(count):
        channel.basic_publish("", name, f"{n:04d}".encode() + b"." * size)


def read(
    connection: pika.BlockingConnection, name: str, offset: object, count: int, prefetch: int = 50
) -> list[tuple[int, bytes, bool]]:
    """`count` deliveries from a consumer starting at `offset`, acked, as (x-stream-offset
    header, body prefix, redelivered)."""
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    got = []
    arguments = {} if offset is None else {"x-stream-offset": offset}
    for method, properties, body in channel.consume(
        name, arguments=arguments, inactivity_timeout=TIMEOUT_S
    ):
        assert method is not None, f"only {len(got)} of {count} deliveries came"
        got.append((properties.headers["x-stream-offset"], body[:4], method.redelivered))
        channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    channel.close()
    return got


def offsets(got: list[tuple[int, bytes, bool]]) -> list[int]:
    return [o for o, _, _ in got]


def refused(connection: pika.BlockingConnection, action: object) -> pika.exceptions.AMQPError:
    channel = connection.channel()
    with pytest.raises(
        (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker)
    ) as closed:
        action(channel)  # type: ignore[operator]
    return closed.value


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"durable": False}, "invalid property 'non-durable' for queue 's' in vhost '/'"),
        (
            {"durable": True, "exclusive": True},
            "invalid property 'exclusive-owner' for queue 's' in vhost '/'",
        ),
        (
            {"durable": True, "auto_delete": True},
            "invalid property 'auto-delete' for queue 's' in vhost '/'",
        ),
        (
            {"durable": True, "arguments": {"x-dead-letter-exchange": "dlx"}},
            "invalid arg 'x-dead-letter-exchange' for queue 's' in vhost '/' "
            "of queue type rabbit_stream_queue",
        ),
    ],
)
def test_stream_declaration_rules(
    connection: pika.BlockingConnection, kwargs: dict, text: str
) -> None:
    arguments = {"x-queue-type": "stream", **kwargs.pop("arguments", {})}
    error = refused(connection, lambda ch: ch.queue_declare("s", arguments=arguments, **kwargs))
    assert isinstance(error, pika.exceptions.ChannelClosedByBroker)
    assert (error.reply_code, error.reply_text) == (406, f"PRECONDITION_FAILED - {text}")


def test_consumers_need_a_prefetch_and_manual_acks_and_get_is_not_implemented(
    connection: pika.BlockingConnection,
) -> None:
    declare_stream(connection.channel(), "rules")
    error = refused(connection, lambda ch: ch.basic_consume("rules", lambda *a: None))
    assert error.reply_code == 406
    assert "consumer prefetch count is not set for 'queue 'rules' in vhost '/''" in str(error)

    def no_ack(ch: BlockingChannel) -> None:
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume("rules", lambda *a: None, auto_ack=True)

    error = refused(connection, no_ack)
    assert error.reply_code == 540
    conn = connect_like(connection)
    error = refused(conn, lambda ch: ch.basic_get("rules"))
    assert error.reply_code == 540
    assert "basic.get not supported by stream queues" in str(error)


def connect_like(connection: pika.BlockingConnection) -> pika.BlockingConnection:
    """A new connection to the same broker (a 540 closes the whole connection)."""
    params = connection._impl.params  # pika keeps them there
    return pika.BlockingConnection(params)


def test_every_offset_form(connection: pika.BlockingConnection) -> None:
    declare_stream(connection.channel(), "events", count=60)
    assert offsets(read(connection, "events", "first", 60)) == list(range(60))
    assert offsets(read(connection, "events", 42, 18)) == list(range(42, 60))
    assert offsets(read(connection, "events", -5, 5)) == list(range(55, 60))
    # last: the first offset of the newest segment (the segments are 4 KiB: several)
    last = read(connection, "events", "last", 1)
    assert 0 < last[0][0] < 60
    # an interval and a timestamp in the past: everything
    assert offsets(read(connection, "events", "1h", 60)) == list(range(60))
    past = datetime.datetime.now(tz=datetime.UTC) - datetime.timedelta(hours=1)
    assert offsets(read(connection, "events", past, 60)) == list(range(60))
    body_and_header = read(connection, "events", "first", 1)[0]
    assert body_and_header[:2] == (0, b"0000")


def test_a_timestamp_seek_delivers_nothing_older(connection: pika.BlockingConnection) -> None:
    channel = connection.channel()
    declare_stream(channel, "timed", count=20)
    time.sleep(1.1)  # timestamps have a one-second resolution in AMQP
    cut = datetime.datetime.now(tz=datetime.UTC)
    for n in range(20, 25):
        channel.basic_publish("", "timed", f"{n:04d}".encode())
    assert offsets(read(connection, "timed", cut, 5)) == list(range(20, 25))
    assert offsets(read(connection, "timed", "1s", 5)) == list(range(20, 25))


def test_bad_offsets_are_406(connection: pika.BlockingConnection) -> None:
    declare_stream(connection.channel(), "bad")
    for value in ("yesterday", "10x", True):

        def consume(ch: BlockingChannel, value: object = value) -> None:
            ch.basic_qos(prefetch_count=10)
            ch.basic_consume("bad", lambda *a: None, arguments={"x-stream-offset": value})

        error = refused(connection, consume)
        assert error.reply_code == 406
        assert "invalid x-stream-offset" in str(error)


def test_next_is_the_default_and_new_messages_wake_consumers(
    connection: pika.BlockingConnection, broker: RunningBroker
) -> None:
    """Several consumers wait at the end of the stream; each gets every new message."""
    declare_stream(connection.channel(), "live", count=5)
    consumers = []
    for _ in range(3):
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)
        consumers.append(channel)
    got: list[list[int]] = [[] for _ in consumers]
    for index, channel in enumerate(consumers):

        def on_message(ch, method, properties, body, index=index):  # type: ignore[no-untyped-def]
            got[index].append(properties.headers["x-stream-offset"])
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume("live", on_message)  # no x-stream-offset: next
    connection.process_data_events(time_limit=0.2)
    assert got == [[], [], []]
    publisher = connect(broker)
    pub = publisher.channel()
    for n in range(10):
        pub.basic_publish("", "live", str(n).encode())
    publisher.close()
    deadline = time.monotonic() + TIMEOUT_S
    while any(len(g) < 10 for g in got) and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert got == [list(range(5, 15))] * 3


def test_nack_with_requeue_redelivers_to_the_same_consumer(
    connection: pika.BlockingConnection,
) -> None:
    declare_stream(connection.channel(), "again", count=3)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1)
    seen = []
    for method, properties, _ in channel.consume(
        "again", arguments={"x-stream-offset": "first"}, inactivity_timeout=TIMEOUT_S
    ):
        assert method is not None
        seen.append((properties.headers["x-stream-offset"], method.redelivered))
        if len(seen) == 1:
            channel.basic_nack(method.delivery_tag, requeue=True)
        else:
            channel.basic_ack(method.delivery_tag)
        if len(seen) == 4:
            break
    assert seen == [(0, False), (0, True), (1, False), (2, False)]


def test_streams_and_classic_queues_from_one_publish_and_a_restart(
    broker: RunningBroker,
) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.exchange_declare("fan", "fanout", durable=True)
    channel.queue_declare("log", durable=True, arguments=SMALL_SEGMENTS)
    channel.queue_declare("work", durable=True)
    channel.queue_bind("log", "fan")
    channel.queue_bind("work", "fan")
    channel.confirm_delivery()
    for n in range(30):
        channel.basic_publish("fan", "", f"{n:04d}".encode() + b"x" * 200)
    assert channel.queue_declare("log", passive=True).method.message_count == 30
    conn.close()
    broker.stop()
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        got = read(conn, "log", "first", 30)
        assert offsets(got) == list(range(30))
        assert [b for _, b, _ in got] == [f"{n:04d}".encode() for n in range(30)]
        assert conn.channel().queue_declare("work", passive=True).method.message_count == 30
        conn.close()


def first_offset(connection: pika.BlockingConnection, name: str) -> int:
    return read(connection, name, "first", 1)[0][0]


@pytest.mark.parametrize(
    "retention",
    [{"x-max-length": 20}, {"x-max-length-bytes": 5000}],
)
def test_retention_by_length_and_bytes_drops_whole_old_segments(
    connection: pika.BlockingConnection, retention: dict
) -> None:
    """4 KiB segments hold a few dozen 100-byte messages: 200 messages fill several, and
    the rules keep about one or two of them."""
    channel = connection.channel()
    channel.queue_declare("kept", durable=True, arguments={**SMALL_SEGMENTS, **retention})
    channel.confirm_delivery()
    for n in range(200):
        channel.basic_publish("", "kept", f"{n:04d}".encode() + b"." * 100)
    first = first_offset(connection, "kept")
    assert first > 100  # old segments are gone
    got = read(connection, "kept", "first", 200 - first)
    assert offsets(got) == list(range(first, 200))  # what is kept is intact and in order


def test_retention_by_age_when_a_segment_rolls(connection: pika.BlockingConnection) -> None:
    channel = connection.channel()
    channel.queue_declare("aged", durable=True, arguments={**SMALL_SEGMENTS, "x-max-age": "1s"})
    channel.confirm_delivery()
    for n in range(100):
        channel.basic_publish("", "aged", f"{n:04d}".encode() + b"." * 100)
    assert first_offset(connection, "aged") == 0
    time.sleep(1.2)
    for n in range(100, 140):  # rolls a segment: retention is checked again
        channel.basic_publish("", "aged", f"{n:04d}".encode() + b"." * 100)
    # Every segment whose messages are all older than 1 s is gone; the one that was
    # active when the pause began also holds new messages, so it stays whole.
    assert 0 < first_offset(connection, "aged") <= 100


def test_a_bad_retention_argument_is_406(connection: pika.BlockingConnection) -> None:
    arguments = {"x-queue-type": "stream", "x-max-age": "7 days"}
    error = refused(
        connection, lambda ch: ch.queue_declare("badage", durable=True, arguments=arguments)
    )
    assert error.reply_code == 406
    assert "invalid x-max-age '7 days'" in str(error)


def publish_tagged(channel: BlockingChannel, name: str, tags: list[str | None]) -> None:
    for n, tag in enumerate(tags):
        headers = {} if tag is None else {"x-stream-filter-value": tag}
        channel.basic_publish("", name, str(n).encode(), pika.BasicProperties(headers=headers))


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"x-stream-filter": "eu"}, [0, 3]),
        ({"x-stream-filter": ["eu", "us"]}, [0, 1, 3, 4]),
        ({"x-stream-filter": "eu", "x-stream-match-unfiltered": True}, [0, 2, 3]),
        ({"x-stream-filter": ["eu", "vip"], "x-filter-match-type": "all"}, [3]),
    ],
)
def test_filters_are_exact_and_server_side(
    connection: pika.BlockingConnection, arguments: dict, expected: list[int]
) -> None:
    channel = connection.channel()
    declare_stream(channel, "tagged")
    publish_tagged(channel, "tagged", ["eu", "us", None, "eu,vip", "us,vip", "asia"])
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=10)
    got = []
    for method, properties, _ in consumer.consume(
        "tagged",
        arguments={"x-stream-offset": "first", **arguments},
        inactivity_timeout=0.5,
    ):
        if method is None:
            break
        got.append(properties.headers["x-stream-offset"])
        consumer.basic_ack(method.delivery_tag)
    assert got == expected


def test_a_bad_filter_is_406(connection: pika.BlockingConnection) -> None:
    declare_stream(connection.channel(), "badfilter")

    def consume(ch: BlockingChannel) -> None:
        ch.basic_qos(prefetch_count=10)
        arguments = {"x-stream-filter": "eu", "x-filter-match-type": "most"}
        ch.basic_consume("badfilter", lambda *a: None, arguments=arguments)

    error = refused(connection, consume)
    assert error.reply_code == 406
    assert "invalid x-filter-match-type 'most'" in str(error)


def test_offset_tracking_resumes_after_what_was_acked_across_reconnect_and_restart(
    broker: RunningBroker,
) -> None:
    """The stored offset is the highest acked with all before it: a message delivered but
    not acked before the consumer left comes again."""
    conn = connect(broker)
    declare_stream(conn.channel(), "tracked", count=10)
    tracking = {"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True}

    def take(connection: pika.BlockingConnection, acks: list[int], count: int) -> list[int]:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=20)
        got = []
        for method, properties, _ in channel.consume(
            "tracked", arguments=tracking, consumer_tag="reader", inactivity_timeout=TIMEOUT_S
        ):
            assert method is not None
            offset = properties.headers["x-stream-offset"]
            got.append(offset)
            if offset in acks:
                channel.basic_ack(method.delivery_tag)
            if len(got) == count:
                break
        channel.close()
        return got

    # 0-3 and 5 acked, 4 not: the stored offset is 3.
    assert take(conn, [0, 1, 2, 3, 5], 6) == [0, 1, 2, 3, 4, 5]
    assert take(conn, [4, 5, 6], 3) == [4, 5, 6]
    conn.close()
    broker.stop()
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        assert take(conn, [], 3) == [7, 8, 9]
        conn.close()


def test_offset_tracking_needs_a_named_consumer(broker: RunningBroker) -> None:
    """pika always names its consumers; py-amqp sends the empty tag that asks the broker
    for a name, which offset tracking cannot use."""
    conn = amqp.Connection(f"127.0.0.1:{broker.amqp_port}", connect_timeout=TIMEOUT_S)
    conn.connect()
    try:
        channel = conn.channel()
        channel.queue_declare(
            "anon", durable=True, auto_delete=False, arguments={"x-queue-type": "stream"}
        )
        channel.basic_qos(0, 10, False)
        with pytest.raises(amqp.exceptions.PreconditionFailed, match="consumer tag chosen"):
            channel.basic_consume(
                "anon", consumer_tag="", arguments={"x-stream-automatic-offset-tracking": True}
            )
    finally:
        conn.collect()


def test_a_restart_keeps_exactly_what_the_rules_kept(broker: RunningBroker) -> None:
    """Retention is checked on a roll, on a policy change, periodically and at start-up;
    the start-up check must keep what a check in the running broker keeps."""
    conn = connect(broker)
    channel = conn.channel()
    arguments = {**SMALL_SEGMENTS, "x-max-length": 30}
    channel.queue_declare("ruled", durable=True, arguments=arguments)
    channel.confirm_delivery()
    for n in range(150):
        channel.basic_publish("", "ruled", f"{n:04d}".encode() + b"." * 100)
    # Any policy change makes every stream check its rules now (this one matches nothing).
    noop = {"pattern": "^no-such-queue$", "definition": {"max-length": 1}}
    assert broker.put_policy("noop", noop) == 201
    before = first_offset(conn, "ruled")
    count = channel.queue_declare("ruled", passive=True).method.message_count
    conn.close()
    broker.stop()
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        assert first_offset(conn, "ruled") == before
        channel = conn.channel()
        assert channel.queue_declare("ruled", passive=True).method.message_count == count
        assert offsets(read(conn, "ruled", "first", 150 - before)) == list(range(before, 150))
        conn.close()
