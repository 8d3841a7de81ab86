"""x-delivery-limit (argument and policy delivery-limit) with pika and aio-pika: a message
requeued more often than the limit (nack, reject, recover, a closed channel) is
dead-lettered with reason delivery_limit, or dropped without a dead-letter exchange; the
x-delivery-count header counts the deliveries before; the count survives a restart."""

from __future__ import annotations

import aio_pika
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker, broker_on, dead_letter_setup

TIMEOUT_S = 10


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))


def setup(channel: BlockingChannel, durable: bool = False, **arguments: object) -> None:
    dead_letter_setup(channel, "src", durable, **arguments)


def test_requeued_past_the_limit_is_dead_lettered_with_x_death(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    setup(channel, **{"x-delivery-limit": 2, "x-dead-letter-exchange": "dlx"})
    channel.basic_publish("", "src", b"job", pika.BasicProperties(headers={"n": 1}))
    counts = []
    for _ in range(3):  # delivered 3 times: the limit allows 2 requeues
        method, properties, body = channel.basic_get("src")
        assert body == b"job"
        counts.append((properties.headers.get("x-delivery-count"), method.redelivered))
        channel.basic_nack(method.delivery_tag, requeue=True)
    assert counts == [(None, False), (1, True), (2, True)]
    assert channel.basic_get("src")[0] is None
    method, properties, body = channel.basic_get("dead", auto_ack=True)
    assert body == b"job"
    headers = properties.headers
    [death] = headers["x-death"]
    assert {k: death[k] for k in ("count", "reason", "queue", "exchange", "routing-keys")} == {
        "count": 1,
        "reason": "delivery_limit",
        "queue": "src",
        "exchange": "",
        "routing-keys": ["src"],
    }
    assert headers["x-first-death-reason"] == "delivery_limit"
    assert headers["x-first-death-queue"] == "src"
    assert headers["n"] == 1
    conn.close()


def test_without_a_dead_letter_exchange_the_message_is_dropped(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("src", arguments={"x-delivery-limit": 0})
    channel.basic_publish("", "src", b"once")
    channel.basic_publish("", "src", b"kept")
    method, _, body = channel.basic_get("src")
    assert body == b"once"
    channel.basic_reject(method.delivery_tag, requeue=True)  # 0 requeues allowed: dropped
    assert channel.queue_declare("src", passive=True).method.message_count == 1
    assert channel.basic_get("src", auto_ack=True)[2] == b"kept"
    conn.close()


def test_a_closed_channel_and_recover_count_as_requeues(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    setup(channel, **{"x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"})
    channel.basic_publish("", "src", b"job")
    other = conn.channel()
    assert other.basic_get("src")[2] == b"job"
    other.close()  # requeue 1: within the limit
    method, _, _ = channel.basic_get("src")
    assert method.redelivered
    channel.basic_recover(requeue=True)  # requeue 2: past it
    assert channel.basic_get("src")[0] is None
    assert channel.basic_get("dead", auto_ack=True)[2] == b"job"
    conn.close()


def test_the_policy_sets_a_limit_and_the_smaller_wins(broker: RunningBroker) -> None:
    definition = {"delivery-limit": 1, "dead-letter-exchange": "dlx"}
    assert broker.put_policy("limit", {"pattern": "^src", "definition": definition}) == 201
    conn = connect(broker)
    channel = conn.channel()
    setup(channel, **{"x-delivery-limit": 5})
    channel.queue_declare("src-policy-only")
    for queue in ("src", "src-policy-only"):
        channel.basic_publish("", queue, queue.encode())
        for _ in range(2):
            method, _, _ = channel.basic_get(queue)
            channel.basic_nack(method.delivery_tag, requeue=True)
        assert channel.basic_get(queue)[0] is None, queue
    dead = [channel.basic_get("dead", auto_ack=True)[2] for _ in range(2)]
    assert sorted(dead) == [b"src", b"src-policy-only"]
    conn.close()


def test_the_delivery_count_survives_a_restart(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    setup(channel, durable=True, **{"x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"})
    channel.confirm_delivery()
    channel.basic_publish("", "src", b"job", pika.BasicProperties(delivery_mode=2))
    method, _, _ = channel.basic_get("src")
    channel.basic_nack(method.delivery_tag, requeue=True)  # requeue 1
    conn.close()
    broker.stop()
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        channel = conn.channel()
        method, properties, _ = channel.basic_get("src")
        assert properties.headers["x-delivery-count"] == 1
        channel.basic_nack(method.delivery_tag, requeue=True)  # requeue 2: past the limit
        assert channel.basic_get("src")[0] is None
        assert channel.basic_get("dead", auto_ack=True)[2] == b"job"
        conn.close()


@pytest.mark.parametrize(
    ("value", "problem"),
    [(-1, "{value_negative,-1}"), ("2", '"expected integer, got longstr"')],
)
def test_a_bad_delivery_limit_is_406(broker: RunningBroker, value: object, problem: str) -> None:
    conn = connect(broker)
    channel = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.queue_declare("src", arguments={"x-delivery-limit": value})
    assert raised.value.reply_code == 406
    assert raised.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-delivery-limit' for queue 'src' in vhost '/': "
        f"{problem}"
    )
    conn.close()


async def test_aio_pika_rejects_until_the_limit(broker: RunningBroker) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel()
        dlx = await channel.declare_exchange("dlx", aio_pika.ExchangeType.FANOUT)
        dead = await channel.declare_queue("dead")
        await dead.bind(dlx)
        queue = await channel.declare_queue(
            "src", arguments={"x-delivery-limit": 3, "x-dead-letter-exchange": "dlx"}
        )
        await channel.default_exchange.publish(aio_pika.Message(b"job"), routing_key="src")
        seen = []
        async with queue.iterator() as messages:
            async for message in messages:
                seen.append(message.headers.get("x-delivery-count"))
                await message.reject(requeue=True)
                if len(seen) == 4:
                    break
        assert seen == [None, 1, 2, 3]
        got = await dead.get(timeout=TIMEOUT_S)
        assert got.body == b"job"
        assert got.headers["x-death"][0]["reason"] == "delivery_limit"
        await got.ack()
        assert await queue.get(fail=False) is None
