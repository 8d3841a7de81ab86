"""CC and BCC headers and the consistent hash exchange, with pika and aio-pika: routing,
the BCC header never reaching a consumer, RabbitMQ's errors for wrong header types and
binding keys, and hashing on the routing key, a header or a property across a restart."""

from __future__ import annotations

import collections

import aio_pika
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker, broker_on

TIMEOUT_S = 10


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def drain(channel: BlockingChannel, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
    """Every message in `queue` now (published on the same connection before, so routed)."""
    got = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((properties, body))


# -- CC and BCC -------------------------------------------------------------------------


def test_cc_and_bcc_route_with_extra_keys_and_bcc_is_stripped(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.exchange_declare("logs", "direct")
    for name in ("to", "cc", "bcc", "other"):
        channel.queue_declare(name)
        channel.queue_bind(name, "logs", name)
    headers = {"CC": ["cc", 7], "BCC": ["bcc"], "keep": "me"}
    channel.basic_publish("logs", "to", b"m", pika.BasicProperties(headers=headers))
    for name in ("to", "cc", "bcc"):
        [(properties, body)] = drain(channel, name)
        assert body == b"m"
        assert properties.headers == {"CC": ["cc", 7], "keep": "me"}  # BCC stripped
    assert drain(channel, "other") == []
    conn.close()


def test_cc_on_the_default_exchange_and_a_queue_named_twice_gets_one_copy(
    broker: RunningBroker,
) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("a")
    channel.queue_declare("b")
    channel.basic_publish(
        "", "a", b"x", pika.BasicProperties(headers={"CC": ["a", "b"], "BCC": ["b"]})
    )
    assert len(drain(channel, "a")) == 1
    assert len(drain(channel, "b")) == 1
    conn.close()


@pytest.mark.parametrize(
    ("headers", "text"),
    [
        ({"CC": "b"}, 'invalid message: {unacceptable_type_in_header,"CC",longstr}'),
        ({"BCC": 5}, 'invalid message: {unacceptable_type_in_header,"BCC",signedint}'),
        ({"CC": {"k": 1}}, 'invalid message: {unacceptable_type_in_header,"CC",table}'),
    ],
)
def test_cc_of_a_wrong_type_closes_the_channel_with_406(
    broker: RunningBroker, headers: dict[str, object], text: str
) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("a")
    channel.basic_publish("", "a", b"x", pika.BasicProperties(headers=headers))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="PRECONDITION_FAILED") as info:
        channel.basic_get("a")
    assert info.value.reply_code == 406
    assert info.value.reply_text == f"PRECONDITION_FAILED - {text}"
    assert conn.channel().queue_declare("a", passive=True).method.message_count == 0
    conn.close()


def test_mandatory_with_cc_is_returned_only_when_no_key_routes(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.queue_declare("only")
    channel.basic_publish(
        "", "nowhere", b"1", pika.BasicProperties(headers={"BCC": ["only"]}), mandatory=True
    )
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish(
            "", "nowhere", b"2", pika.BasicProperties(headers={"CC": ["gone"]}), mandatory=True
        )
    assert [body for _, body in drain(channel, "only")] == [b"1"]
    conn.close()


async def test_cc_and_bcc_with_aio_pika(broker: RunningBroker) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange("aio-cc", aio_pika.ExchangeType.TOPIC)
        queues = {}
        for key in ("a.x", "b.x", "c.x"):
            queues[key] = await channel.declare_queue(key, exclusive=True)
            await queues[key].bind(exchange, key.replace(".x", ".*"))
        await exchange.publish(
            aio_pika.Message(b"hi", headers={"CC": ["b.x"], "BCC": ["c.x"]}), routing_key="a.x"
        )
        for key in ("a.x", "b.x", "c.x"):
            message = await queues[key].get(timeout=TIMEOUT_S, no_ack=True)
            assert message.body == b"hi" and message.routing_key == "a.x"
            assert "BCC" not in message.headers and message.headers["CC"] == ["b.x"]


# -- consistent hash ----------------------------------------------------------------------


def hash_setup(channel: BlockingChannel, name: str, weights: dict[str, str], **args: str) -> None:
    channel.exchange_declare(name, "x-consistent-hash", durable=True, arguments=args)
    for queue, weight in weights.items():
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, name, weight)


def counts(channel: BlockingChannel, queues: list[str]) -> dict[str, int]:
    return {q: channel.queue_declare(q, passive=True).method.message_count for q in queues}


def test_consistent_hash_spreads_by_weight_and_is_stable_per_key(broker: RunningBroker) -> None:
    """Weights 1 and 3: about a quarter of 2000 keys go to the first queue; every copy
    of a key goes where the key went first."""
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    hash_setup(channel, "hash", {"h1": "1", "h3": "3"})
    for n in range(2000):
        channel.basic_publish("hash", f"key-{n}", b"")
    got = counts(channel, ["h1", "h3"])
    assert sum(got.values()) == 2000
    assert 350 < got["h1"] < 650, got
    channel.queue_purge("h1")
    channel.queue_purge("h3")
    for _ in range(5):
        channel.basic_publish("hash", "same-key", b"")
    assert sorted(counts(channel, ["h1", "h3"]).values()) == [0, 5]
    conn.close()


def test_consistent_hash_on_a_header_and_on_a_property(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    hash_setup(channel, "by-header", {"ha": "1", "hb": "1"}, **{"hash-header": "user"})
    hash_setup(channel, "by-id", {"pa": "1", "pb": "1"}, **{"hash-property": "message_id"})
    for n in range(40):
        # The routing key varies, the hashed value does not: one queue gets all.
        channel.basic_publish("by-header", str(n), b"", pika.BasicProperties(headers={"user": 7}))
        channel.basic_publish("by-id", str(n), b"", pika.BasicProperties(message_id="m-1"))
    assert sorted(counts(channel, ["ha", "hb"]).values()) == [0, 40]
    assert sorted(counts(channel, ["pa", "pb"]).values()) == [0, 40]
    for n in range(200):
        channel.basic_publish("by-id", "k", b"", pika.BasicProperties(message_id=f"id-{n}"))
    spread = counts(channel, ["pa", "pb"])
    assert min(spread.values()) > 40, spread  # 240 in all: both get a good share
    conn.close()


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        (
            {"hash-header": "a", "hash-property": "message_id"},
            "hash-header and hash-property are mutually exclusive",
        ),
        ({"hash-property": "priority"}, "Unsupported property: priority"),
    ],
)
def test_consistent_hash_refuses_bad_arguments(
    broker: RunningBroker, arguments: dict[str, str], text: str
) -> None:
    channel = connect(broker).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match=text) as info:
        channel.exchange_declare("bad-hash", "x-consistent-hash", arguments=arguments)
    assert info.value.reply_code == 406


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("heavy", 'The binding key must be an integer: <<"heavy">>'),
        ("0", "The binding key must be greater than 0"),
    ],
)
def test_consistent_hash_binding_key_must_be_a_weight(
    broker: RunningBroker, key: str, text: str
) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.exchange_declare("weights", "x-consistent-hash")
    channel.queue_declare("w")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.queue_bind("w", "weights", key)
    assert info.value.reply_code == 406
    assert info.value.reply_text == f"PRECONDITION_FAILED - {text}"
    conn.close()


def test_consistent_hash_routes_the_same_after_a_restart(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    hash_setup(channel, "stable", {"s1": "2", "s2": "1", "s3": "1"})
    for n in range(100):
        channel.basic_publish("stable", f"k{n}", str(n).encode())
    before = {q: sorted(int(b) for _, b in drain(channel, q)) for q in ("s1", "s2", "s3")}
    conn.close()
    broker.stop()
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        channel = conn.channel()
        channel.confirm_delivery()
        for n in range(100):
            channel.basic_publish("stable", f"k{n}", str(n).encode())
        after = {q: sorted(int(b) for _, b in drain(channel, q)) for q in ("s1", "s2", "s3")}
        assert after == before
        conn.close()


async def test_consistent_hash_with_aio_pika(broker: RunningBroker) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange("aio-hash", "x-consistent-hash")
        seen: collections.Counter[str] = collections.Counter()
        queues = [await channel.declare_queue(f"aio-h{n}", exclusive=True) for n in range(3)]
        for queue in queues:
            await queue.bind(exchange, "5")
        for n in range(300):
            await exchange.publish(aio_pika.Message(b""), routing_key=str(n))
        for queue in queues:
            seen[queue.name] = queue.declaration_result.message_count
            declared = await channel.declare_queue(queue.name, passive=True)
            seen[queue.name] = declared.declaration_result.message_count
        assert sum(seen.values()) == 300
        assert min(seen.values()) > 50, seen
