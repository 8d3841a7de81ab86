"""Message deduplication (LavinMQ's `x-message-deduplication`) with pika and aio-pika, on
exchanges and on queues: duplicates are dropped and still confirmed, a custom header,
the cache's size and TTL (argument and per message), argument type errors, and the
arguments kept across a restart (the cache itself is in memory, as LavinMQ's)."""

from __future__ import annotations

import time

import aio_pika
import pika
import pytest

from tests.integration.conftest import RunningBroker, broker_on, drain_bodies

TIMEOUT_S = 10
DEDUP = "x-deduplication-header"


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def keyed(key: object, **more: object) -> pika.BasicProperties:
    return pika.BasicProperties(headers={DEDUP: key, **more})


def test_exchange_drops_duplicates_and_confirms_them(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()  # every publish below is acked: basic_publish raises on nack
    channel.exchange_declare("dd", "fanout", arguments={"x-message-deduplication": True})
    channel.queue_declare("q1")
    channel.queue_declare("q2")
    channel.queue_bind("q1", "dd")
    channel.queue_bind("q2", "dd")
    channel.basic_publish("dd", "", b"a", keyed("k1"))
    channel.basic_publish("dd", "", b"a-again", keyed("k1"))
    channel.basic_publish("dd", "", b"b", keyed("k2"))
    channel.basic_publish("dd", "", b"no-key")
    channel.basic_publish("dd", "", b"no-key")
    assert drain_bodies(channel, "q1") == [b"a", b"b", b"no-key", b"no-key"]
    assert drain_bodies(channel, "q2") == [b"a", b"b", b"no-key", b"no-key"]
    with pytest.raises(pika.exceptions.UnroutableError):  # as LavinMQ: not routed
        channel.basic_publish("dd", "", b"a-3", keyed("k1"), mandatory=True)
    conn.close()


def test_queue_deduplicates_on_its_own(broker: RunningBroker) -> None:
    """Two queues behind one exchange: only the deduplicating one drops the copy."""
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.exchange_declare("plain", "fanout")
    channel.queue_declare("dq", arguments={"x-message-deduplication": True})
    channel.queue_declare("pq")
    channel.queue_bind("dq", "plain")
    channel.queue_bind("pq", "plain")
    for body in (b"1", b"2"):
        channel.basic_publish("plain", "", body, keyed("same"))
    channel.basic_publish("", "dq", b"3", keyed("same"))  # the default exchange too
    assert drain_bodies(channel, "dq") == [b"1"]
    assert drain_bodies(channel, "pq") == [b"1", b"2"]
    conn.close()


def test_custom_header_cache_size_and_ttl(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.queue_declare(
        "small",
        arguments={
            "x-message-deduplication": True,
            "x-cache-size": 2,
            "x-deduplication-header": "order-id",
        },
    )

    def send(key: str, body: bytes) -> None:
        channel.basic_publish("", "small", body, pika.BasicProperties(headers={"order-id": key}))

    send("a", b"a1")
    send("b", b"b1")
    send("a", b"a2")  # duplicate
    send("c", b"c1")  # the cache holds 2: "a" goes
    send("a", b"a3")  # no longer known
    channel.basic_publish("", "small", b"x", keyed("a"))  # the default header is not used
    assert drain_bodies(channel, "small") == [b"a1", b"b1", b"c1", b"a3", b"x"]
    channel.queue_declare("timed", arguments={"x-message-deduplication": True, "x-cache-ttl": 100})
    channel.basic_publish("", "timed", b"t1", keyed("t"))
    channel.basic_publish("", "timed", b"t2", keyed("t"))
    channel.basic_publish("", "timed", b"u1", keyed("u", **{"x-cache-ttl": 60_000}))
    time.sleep(0.15)
    channel.basic_publish("", "timed", b"t3", keyed("t"))  # its 100 ms are over
    channel.basic_publish("", "timed", b"u2", keyed("u"))  # its own TTL holds
    assert drain_bodies(channel, "timed") == [b"t1", b"u1", b"t3"]
    conn.close()


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"x-message-deduplication": "yes"}, "x-message-deduplication header not a Bool"),
        ({"x-message-deduplication": True, "x-cache-size": "big"}, "x-cache-size header not a Int"),
        ({"x-message-deduplication": True, "x-cache-ttl": -1}, "x-cache-ttl has to be positive"),
        (
            {"x-message-deduplication": True, "x-deduplication-header": 5},
            "x-deduplication-header header not a String",
        ),
    ],
)
@pytest.mark.parametrize("kind", ["exchange", "queue"])
def test_wrong_argument_types_are_refused(
    broker: RunningBroker, arguments: dict[str, object], text: str, kind: str
) -> None:
    channel = connect(broker).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        if kind == "exchange":
            channel.exchange_declare("bad-dd", "direct", arguments=arguments)
        else:
            channel.queue_declare("bad-dd", arguments=arguments)
    assert info.value.reply_code == 406
    assert info.value.reply_text == f"PRECONDITION_FAILED - {text}"


def test_deduplication_still_applies_after_a_restart(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    args = {"x-message-deduplication": True}
    channel.exchange_declare("dd-durable", "direct", durable=True, arguments=args)
    channel.queue_declare("dq-durable", durable=True, arguments=args)
    channel.queue_bind("dq-durable", "dd-durable", "k")
    conn.close()
    broker.stop()
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("dd-durable", "k", b"1", keyed("r"))
        channel.basic_publish("dd-durable", "k", b"2", keyed("r"))
        channel.basic_publish("", "dq-durable", b"3", keyed("r"))
        assert drain_bodies(channel, "dq-durable") == [b"1"]
        conn.close()


async def test_deduplication_with_aio_pika(broker: RunningBroker) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(
            "aio-dd", aio_pika.ExchangeType.DIRECT, arguments={"x-message-deduplication": True}
        )
        queue = await channel.declare_queue("aio-dq", exclusive=True)
        await queue.bind(exchange, "k")
        for n in range(6):
            confirmation = await exchange.publish(
                aio_pika.Message(str(n).encode(), headers={DEDUP: n % 3}), routing_key="k"
            )
            assert confirmation is not None  # acked, duplicates included
        got = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            got.append(message.body)
        assert got == [b"0", b"1", b"2"]
