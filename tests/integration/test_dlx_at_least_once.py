"""At-least-once dead-lettering, as RabbitMQ 3.10's quorum queues do it, driven with pika.

A quorum queue with `x-dead-letter-strategy: at-least-once`, `x-overflow: reject-publish`
and a dead-letter exchange keeps each message it dead-letters until every target queue
has its copy: a full target (reject-publish) leaves the message in the source, neither
ready nor deliverable but counted against its length limit, and it moves once the target
has room. It survives a stop and a SIGKILL in between. The default (at-most-once), and
at-least-once without reject-publish (RabbitMQ falls back to at-most-once), drop it.
The source's held dead letters are read from the broker's state only to know when a
step is done; every outcome is asserted through the clients.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import aio_pika
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, NackError

from tests.integration.broker_process import BrokerProcess
from tests.integration.conftest import RunningBroker, broker_on, drain_bodies

TIMEOUT_S = 10.0
# More than the retry interval (dead_letters.RETRY_INTERVAL_MS) and several housekeeping
# ticks: what has not moved by then would not move at all.
SETTLE_S = 2.5
SOURCE = "source"
TARGET = "target"


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=10)
    )


def source_arguments(**more: object) -> dict[str, object]:
    return {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": TARGET,
        **more,
    }


AT_LEAST_ONCE = source_arguments(
    **{"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
)


def declare(channel: BlockingChannel, arguments: dict[str, object]) -> None:
    """A full target (one message, reject-publish) and the source with `arguments`."""
    channel.queue_declare(
        TARGET, durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    channel.queue_declare(SOURCE, durable=True, arguments=arguments)
    channel.confirm_delivery()
    channel.basic_publish("", TARGET, b"filler", pika.BasicProperties(delivery_mode=2))


def reject_one(channel: BlockingChannel, body: bytes) -> None:
    """Publish `body` to the source (confirmed) and reject it without requeue."""
    channel.basic_publish("", SOURCE, body, pika.BasicProperties(delivery_mode=2))
    method, _, got = channel.basic_get(SOURCE)
    assert method is not None and got == body
    channel.basic_reject(method.delivery_tag, requeue=False)


def depth(channel: BlockingChannel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def held(broker: RunningBroker) -> int:
    """How many dead letters the source holds (broker state, read on its loop)."""
    return broker.ask(lambda: len(broker.broker.vhosts["/"].queues[SOURCE].cursor.dead))  # type: ignore[union-attr]


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.05)


def wait_for_dead_letter(channel: BlockingChannel) -> tuple[pika.BasicProperties, bytes]:
    """The next message of the target, waited for (the retry runs on a timer)."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        method, properties, body = channel.basic_get(TARGET, auto_ack=True)
        if method is not None:
            return properties, body
        assert time.monotonic() < deadline, "the dead letter never reached the target"
        channel.connection.process_data_events(time_limit=0.05)


def assert_rejected_death(properties: pika.BasicProperties) -> None:
    [death] = properties.headers["x-death"]
    assert (death["count"], death["reason"], death["queue"]) == (1, "rejected", SOURCE)
    assert properties.headers["x-first-death-reason"] == "rejected"


def test_a_full_target_keeps_the_dead_letter_in_the_source_until_it_has_room(
    broker: RunningBroker,
) -> None:
    conn = connect(broker.amqp_port)
    channel = conn.channel()
    declare(channel, {**AT_LEAST_ONCE, "x-max-length": 1})
    reject_one(channel, b"kept")
    channel.connection.process_data_events(time_limit=SETTLE_S)
    # Held: not ready, not deliverable, and the target still holds only its filler.
    assert depth(channel, SOURCE) == 0 and depth(channel, TARGET) == 1
    assert channel.basic_get(SOURCE)[0] is None
    assert held(broker) == 1
    # It counts against the source's length limit (RabbitMQ's rabbit_fifo:is_over_limit).
    with pytest.raises(NackError):
        channel.basic_publish("", SOURCE, b"no room", pika.BasicProperties(delivery_mode=2))
    # Room in the target: the dead letter moves, with its death recorded once.
    assert drain_bodies(channel, TARGET) == [b"filler"]
    properties, body = wait_for_dead_letter(channel)
    assert body == b"kept"
    assert_rejected_death(properties)
    wait_until(lambda: held(broker) == 0, "the source lets the dead letter go")
    channel.basic_publish("", SOURCE, b"room again", pika.BasicProperties(delivery_mode=2))
    assert depth(channel, SOURCE) == 1
    channel.connection.process_data_events(time_limit=SETTLE_S)
    assert drain_bodies(channel, TARGET) == []  # exactly once
    conn.close()


def test_a_target_with_room_gets_the_dead_letter_at_once(broker: RunningBroker) -> None:
    conn = connect(broker.amqp_port)
    channel = conn.channel()
    channel.queue_declare(TARGET, durable=True)
    channel.queue_declare(SOURCE, durable=True, arguments=AT_LEAST_ONCE)
    channel.confirm_delivery()
    reject_one(channel, b"straight")
    properties, body = wait_for_dead_letter(channel)
    assert body == b"straight"
    assert_rejected_death(properties)
    wait_until(lambda: held(broker) == 0, "the source lets the dead letter go")
    conn.close()


def test_expired_messages_are_held_too(broker: RunningBroker) -> None:
    conn = connect(broker.amqp_port)
    channel = conn.channel()
    declare(channel, {**AT_LEAST_ONCE, "x-message-ttl": 50})
    for body in (b"e1", b"e2"):
        channel.basic_publish("", SOURCE, body, pika.BasicProperties(delivery_mode=2))
    wait_until(lambda: held(broker) == 2, "both expire into the source's held dead letters")
    assert depth(channel, SOURCE) == 0
    assert drain_bodies(channel, TARGET) == [b"filler"]
    first, first_body = wait_for_dead_letter(channel)
    assert first_body == b"e1" and first.headers["x-death"][0]["reason"] == "expired"
    # The target holds one message: the second waits until the first is taken.
    _, second_body = wait_for_dead_letter(channel)
    assert second_body == b"e2"
    wait_until(lambda: held(broker) == 0, "the source lets both go")
    conn.close()


def test_the_delivery_limit_holds_its_dead_letters_too(broker: RunningBroker) -> None:
    conn = connect(broker.amqp_port)
    channel = conn.channel()
    declare(channel, {**AT_LEAST_ONCE, "x-delivery-limit": 0})
    channel.basic_publish("", SOURCE, b"requeued", pika.BasicProperties(delivery_mode=2))
    method, _, _ = channel.basic_get(SOURCE)
    assert method is not None
    channel.basic_nack(method.delivery_tag, requeue=True)  # past the limit: dead
    wait_until(lambda: held(broker) == 1, "the source holds it")
    assert depth(channel, SOURCE) == 0
    assert drain_bodies(channel, TARGET) == [b"filler"]
    properties, body = wait_for_dead_letter(channel)
    assert body == b"requeued" and properties.headers["x-death"][0]["reason"] == "delivery_limit"
    conn.close()


def test_a_stream_target_gets_it_and_the_source_lets_it_go(broker: RunningBroker) -> None:
    conn = connect(broker.amqp_port)
    channel = conn.channel()
    channel.queue_declare(TARGET, durable=True, arguments={"x-queue-type": "stream"})
    channel.queue_declare(SOURCE, durable=True, arguments=AT_LEAST_ONCE)
    channel.confirm_delivery()
    reject_one(channel, b"to a stream")
    wait_until(lambda: held(broker) == 0, "the stream's copy is durable: released")
    channel.basic_qos(prefetch_count=10)
    for method, properties, body in channel.consume(
        TARGET, arguments={"x-stream-offset": "first"}, inactivity_timeout=TIMEOUT_S
    ):
        assert method is not None, "the stream holds nothing"
        assert body == b"to a stream"
        assert_rejected_death(properties)
        break
    conn.close()


@pytest.mark.parametrize(
    "arguments",
    [
        source_arguments(),  # the default strategy: at-most-once
        source_arguments(**{"x-dead-letter-strategy": "at-most-once"}),
        # RabbitMQ falls back to at-most-once without reject-publish (drop-head default).
        source_arguments(**{"x-dead-letter-strategy": "at-least-once"}),
    ],
    ids=["default", "at-most-once", "at-least-once-drop-head"],
)
def test_at_most_once_drops_what_a_full_target_refuses(
    broker: RunningBroker, arguments: dict[str, object]
) -> None:
    conn = connect(broker.amqp_port)
    channel = conn.channel()
    declare(channel, arguments)
    reject_one(channel, b"lost")
    assert held(broker) == 0
    assert drain_bodies(channel, TARGET) == [b"filler"]
    channel.connection.process_data_events(time_limit=SETTLE_S)
    assert drain_bodies(channel, TARGET) == []
    assert depth(channel, SOURCE) == 0
    conn.close()


def test_a_missing_dead_letter_exchange_keeps_it_until_the_exchange_exists(
    broker: RunningBroker,
) -> None:
    conn = connect(broker.amqp_port)
    channel = conn.channel()
    channel.queue_declare(TARGET, durable=True)
    arguments = {**AT_LEAST_ONCE, "x-dead-letter-exchange": "later"}
    channel.queue_declare(SOURCE, durable=True, arguments=arguments)
    channel.confirm_delivery()
    reject_one(channel, b"waits")
    channel.connection.process_data_events(time_limit=SETTLE_S)
    assert held(broker) == 1 and depth(channel, TARGET) == 0
    channel.exchange_declare("later", "direct", durable=True)
    channel.queue_bind(TARGET, "later", TARGET)
    _, body = wait_for_dead_letter(channel)
    assert body == b"waits"
    conn.close()


def test_a_policy_sets_the_strategy_and_dropping_it_drops_what_is_held(
    broker: RunningBroker,
) -> None:
    conn = connect(broker.amqp_port)
    channel = conn.channel()
    assert broker.put_policy(
        "alo",
        {
            "pattern": f"^{SOURCE}$",
            "apply-to": "queues",
            "definition": {"dead-letter-strategy": "at-least-once", "overflow": "reject-publish"},
        },
    ) in (201, 204)
    declare(channel, source_arguments())
    reject_one(channel, b"by policy")
    wait_until(lambda: held(broker) == 1, "the policy makes the source hold it")
    assert broker.put_policy(
        "alo",
        {
            "pattern": f"^{SOURCE}$",
            "apply-to": "queues",
            "definition": {"dead-letter-strategy": "at-most-once", "overflow": "reject-publish"},
        },
    ) in (201, 204)
    assert held(broker) == 0  # as RabbitMQ: leaving at-least-once drops what was held
    assert drain_bodies(channel, TARGET) == [b"filler"]
    channel.connection.process_data_events(time_limit=SETTLE_S)
    assert drain_bodies(channel, TARGET) == []
    conn.close()


def test_a_bad_policy_strategy_is_refused(broker: RunningBroker) -> None:
    status, body, _ = broker.http(
        "PUT",
        "/api/policies/%2F/bad",
        {"pattern": ".*", "definition": {"dead-letter-strategy": "twice"}},
    )
    assert status == 400
    assert "not a valid dead letter strategy" in str(body)


def test_a_classic_queue_refuses_the_argument(broker: RunningBroker) -> None:
    conn = connect(broker.amqp_port)
    channel = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as closed:
        channel.queue_declare("classic", arguments={"x-dead-letter-strategy": "at-least-once"})
    assert closed.value.reply_code == 406
    assert closed.value.reply_text == (
        "PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue 'classic' "
        "in vhost '/' of queue type rabbit_classic_queue"
    )
    conn.close()


async def test_a_backlog_reaches_an_aio_pika_consumer_in_order_exactly_once(
    broker: RunningBroker,
) -> None:
    """Forty dead letters wait behind a full target of one message; a consumer on the
    target then gets the filler and all forty, in their order, each once."""
    count = 40
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel()  # publisher confirms on
        target = await channel.declare_queue(
            TARGET, durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        source = await channel.declare_queue(SOURCE, durable=True, arguments=AT_LEAST_ONCE)
        exchange = channel.default_exchange
        await exchange.publish(aio_pika.Message(b"filler"), TARGET)
        for n in range(count):
            await exchange.publish(aio_pika.Message(b"%d" % n), SOURCE)
        for _ in range(count):
            message = await source.get(timeout=TIMEOUT_S)
            await message.reject(requeue=False)
        await asyncio.sleep(0)  # the rejects are sent; a full target holds them back
        got: list[bytes] = []
        done = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.append(message.body)
            await message.ack()
            if len(got) == count + 1:
                done.set()

        await target.consume(on_message)
        await asyncio.wait_for(done.wait(), TIMEOUT_S * 2)
        await asyncio.sleep(SETTLE_S)  # nothing more comes: no duplicate
        assert got == [b"filler", *(b"%d" % n for n in range(count))]
        declared = await channel.declare_queue(SOURCE, passive=True)
        assert declared.declaration_result.message_count == 0


def test_held_dead_letters_survive_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with broker_on(data_dir) as broker:
        conn = connect(broker.amqp_port)
        channel = conn.channel()
        declare(channel, AT_LEAST_ONCE)
        reject_one(channel, b"across")
        wait_until(lambda: held(broker) == 1, "the source holds it")
        conn.close()
    with broker_on(data_dir) as broker:
        assert held(broker) == 1
        conn = connect(broker.amqp_port)
        channel = conn.channel()
        assert depth(channel, SOURCE) == 0 and channel.basic_get(SOURCE)[0] is None
        assert drain_bodies(channel, TARGET) == [b"filler"]
        properties, body = wait_for_dead_letter(channel)
        assert body == b"across"
        assert_rejected_death(properties)
        wait_until(lambda: held(broker) == 0, "the source lets it go")
        conn.close()
    with broker_on(data_dir) as broker:
        # Released for good: neither held again nor sent a second time.
        assert held(broker) == 0
        conn = connect(broker.amqp_port)
        channel = conn.channel()
        channel.connection.process_data_events(time_limit=SETTLE_S)
        assert drain_bodies(channel, TARGET) == [] and depth(channel, SOURCE) == 0
        conn.close()


def test_held_dead_letters_survive_sigkill(tmp_path: Path) -> None:
    """SIGKILL while the target is full: the journal's record of the dead letter is
    durable once a later confirmed publish is (one sync round covers both)."""
    process = BrokerProcess(tmp_path / "data")
    try:
        conn = connect(process.amqp_port)
        channel = conn.channel()
        declare(channel, AT_LEAST_ONCE)
        reject_one(channel, b"killed")
        channel.queue_declare("marker", durable=True)
        channel.basic_publish("", "marker", b"sync", pika.BasicProperties(delivery_mode=2))
        assert depth(channel, SOURCE) == 0
        process.kill()
        process = BrokerProcess(tmp_path / "data")
        conn = connect(process.amqp_port)
        channel = conn.channel()
        channel.confirm_delivery()
        assert depth(channel, SOURCE) == 0 and channel.basic_get(SOURCE)[0] is None
        assert drain_bodies(channel, TARGET) == [b"filler"]
        properties, body = wait_for_dead_letter(channel)
        assert body == b"killed"
        assert_rejected_death(properties)
        channel.connection.process_data_events(time_limit=SETTLE_S)
        assert drain_bodies(channel, TARGET) == []
        conn.close()
    finally:
        process.stop()


def test_sigkill_after_the_copy_may_duplicate_but_never_loses(tmp_path: Path) -> None:
    """SIGKILL right after the target took the copy: the target has it at least once;
    a second copy (the source's release was not durable yet) is the same dead letter,
    as RabbitMQ's worker may send twice after a restart."""
    process = BrokerProcess(tmp_path / "data")
    try:
        conn = connect(process.amqp_port)
        channel = conn.channel()
        channel.queue_declare(TARGET, durable=True)
        channel.queue_declare(SOURCE, durable=True, arguments=AT_LEAST_ONCE)
        channel.confirm_delivery()
        reject_one(channel, b"maybe twice")
        channel.queue_declare("marker", durable=True)
        channel.basic_publish("", "marker", b"sync", pika.BasicProperties(delivery_mode=2))
        process.kill()
        process = BrokerProcess(tmp_path / "data")
        conn = connect(process.amqp_port)
        channel = conn.channel()
        first, body = wait_for_dead_letter(channel)
        assert body == b"maybe twice"
        assert_rejected_death(first)
        channel.connection.process_data_events(time_limit=SETTLE_S)
        again = drain_bodies(channel, TARGET)
        assert again in ([], [b"maybe twice"])
        assert depth(channel, SOURCE) == 0
        conn.close()
    finally:
        process.stop()
