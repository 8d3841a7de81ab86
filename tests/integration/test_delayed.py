"""The delayed message exchange (`x-delayed-message`) with pika and aio-pika: messages
with `x-delay` are routed (as `x-delayed-type`) once their delay is over and not before,
in deadline order; RabbitMQ's plugin errors; mandatory returns; and persistent delayed
messages of a durable exchange keep their deadline across a restart."""

from __future__ import annotations

import time

import aio_pika
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker, broker_on, poll_messages

TIMEOUT_S = 10
TRANSIENT_MS = 4000  # the transient messages of the restart test: due after any stop
SETTLE_S = 0.5  # for a timer of the restarted broker to route what came due


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def setup(channel: BlockingChannel, kind: str = "direct", durable: bool = True) -> None:
    channel.exchange_declare(
        "later", "x-delayed-message", durable=durable, arguments={"x-delayed-type": kind}
    )
    channel.queue_declare("due", durable=True)
    channel.queue_bind("due", "later", "k")


def collect(channel: BlockingChannel, queue: str, count: int) -> list[tuple[float, bytes]]:
    """(arrival time, body) of `count` messages, polling every 10 ms."""
    got = poll_messages(channel, queue, count, timeout_s=TIMEOUT_S)
    return [(arrived, body) for arrived, _, body in got]


def delayed(ms: int, persistent: bool = True) -> pika.BasicProperties:
    return pika.BasicProperties(headers={"x-delay": ms}, delivery_mode=2 if persistent else 1)


def test_messages_come_after_their_delay_in_deadline_order(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    setup(channel)
    start = time.monotonic()
    channel.basic_publish("later", "k", b"300", delayed(300))
    channel.basic_publish("later", "k", b"100", delayed(100))
    channel.basic_publish("later", "k", b"now", pika.BasicProperties(headers={"x-delay": 0}))
    channel.basic_publish("later", "k", b"plain")
    got = collect(channel, "due", 4)
    assert [body for _, body in got] == [b"now", b"plain", b"100", b"300"]
    assert got[2][0] - start >= 0.1 and got[3][0] - start >= 0.3
    assert got[3][0] - start < 0.3 + 1.0  # a timer per deadline, not a slow poll
    conn.close()


def test_delayed_fanout_and_headers_types(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.exchange_declare("d-fan", "x-delayed-message", arguments={"x-delayed-type": "fanout"})
    channel.exchange_declare("d-hdr", "x-delayed-message", arguments={"x-delayed-type": "headers"})
    channel.queue_declare("fan")
    channel.queue_declare("hdr")
    channel.queue_bind("fan", "d-fan")
    channel.queue_bind("hdr", "d-hdr", arguments={"x-match": "all", "color": "red"})
    channel.basic_publish("d-fan", "any", b"f", delayed(50))
    red = {"x-delay": 50, "color": "red"}
    channel.basic_publish("d-hdr", "", b"red", pika.BasicProperties(headers=red))
    blue = {"x-delay": 50, "color": "blue"}
    channel.basic_publish("d-hdr", "", b"blue", pika.BasicProperties(headers=blue))
    assert [b for _, b in collect(channel, "fan", 1)] == [b"f"]
    assert [b for _, b in collect(channel, "hdr", 1)] == [b"red"]
    time.sleep(0.1)
    assert channel.basic_get("hdr")[0] is None
    conn.close()


@pytest.mark.parametrize(
    ("arguments", "code", "text"),
    [
        ({}, 406, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
        (
            {"x-delayed-type": "x-delayed-message"},
            406,
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'",
        ),
    ],
)
def test_delayed_type_is_required(
    broker: RunningBroker, arguments: dict[str, str], code: int, text: str
) -> None:
    channel = connect(broker).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.exchange_declare("bad", "x-delayed-message", arguments=arguments)
    assert info.value.reply_code == code
    assert info.value.reply_text == f"PRECONDITION_FAILED - {text}"


def test_unknown_delayed_type_is_a_connection_error(broker: RunningBroker) -> None:
    channel = connect(broker).channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        channel.exchange_declare("bad", "x-delayed-message", arguments={"x-delayed-type": "nope"})
    assert info.value.reply_code == 503


def test_mandatory_delayed_message_is_returned_and_still_delivered(
    broker: RunningBroker,
) -> None:
    """The plugin cannot know the queues of the future: a delayed message counts as
    unrouted now (basic.return with mandatory), and is routed when due all the same."""
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    setup(channel)
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("later", "k", b"m", delayed(50), mandatory=True)
    assert [b for _, b in collect(channel, "due", 1)] == [b"m"]
    conn.close()


def test_deleting_the_exchange_drops_its_delayed_messages(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    setup(channel)
    channel.basic_publish("later", "k", b"gone", delayed(100))
    channel.exchange_delete("later")
    setup(channel)  # a new exchange of the same name: the old messages stay gone
    time.sleep(0.25)
    assert channel.basic_get("due")[0] is None
    conn.close()


def test_delays_survive_a_restart_with_their_deadlines(broker: RunningBroker) -> None:
    """Confirmed persistent messages of a durable delayed exchange: one due while the
    broker is down (routed at start-up), one due later (routed at its deadline, not
    before); a transient message and one of a transient exchange are not kept."""
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    setup(channel)
    channel.exchange_declare(
        "later-transient", "x-delayed-message", arguments={"x-delayed-type": "direct"}
    )
    channel.queue_bind("due", "later-transient", "k")
    start = time.monotonic()
    channel.basic_publish("later", "k", b"during", delayed(200))
    channel.basic_publish("later", "k", b"after", delayed(1500))
    # Not yet due when the broker stops, however long that takes on a loaded machine (a
    # transient message routed before the stop is kept, as any in a durable queue).
    channel.basic_publish("later", "k", b"transient", delayed(TRANSIENT_MS, persistent=False))
    channel.basic_publish("later-transient", "k", b"exchange", delayed(TRANSIENT_MS))
    conn.close()
    broker.stop()
    assert time.monotonic() - start < TRANSIENT_MS / 1000, "stopped after the deadlines"
    time.sleep(max(0.0, 0.3 - (time.monotonic() - start)))
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        channel = conn.channel()
        got = collect(channel, "due", 2)
        assert [body for _, body in got] == [b"during", b"after"]
        assert got[1][0] - start >= 1.5
        # Past the transient ones' deadline: had they been kept, they would be routed now.
        time.sleep(max(0.05, TRANSIENT_MS / 1000 + SETTLE_S - (time.monotonic() - start)))
        assert channel.basic_get("due")[0] is None
        conn.close()
    again = RunningBroker(broker.data_dir)  # released ones are not released twice
    try:
        conn = connect(again)
        channel = conn.channel()
        time.sleep(0.1)
        assert channel.basic_get("due")[0] is None
        conn.close()
    finally:
        again.stop()


async def test_delayed_with_aio_pika(broker: RunningBroker) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(
            "aio-later", "x-delayed-message", arguments={"x-delayed-type": "topic"}
        )
        queue = await channel.declare_queue("aio-due", exclusive=True)
        await queue.bind(exchange, "job.#")
        start = time.monotonic()
        await exchange.publish(
            aio_pika.Message(b"j", headers={"x-delay": 150}), routing_key="job.a.b"
        )
        assert await queue.get(no_ack=True, fail=False) is None
        async with queue.iterator() as messages:
            async for message in messages:
                await message.ack()
                assert message.body == b"j" and message.routing_key == "job.a.b"
                break
        assert time.monotonic() - start >= 0.15
