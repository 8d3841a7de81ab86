"""Queue expiry (x-expires, policy expires) with pika and aio-pika: a queue unused for the
period is deleted; consumers, basic.get and redeclares are uses; a restart starts the
lease again (RabbitMQ: "leases of durable queues restart when the server restarts").
Whether a queue exists is probed with mandatory publishes under confirms, which are no
use of the queue, polled with deadlines."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker, broker_on

TIMEOUT_S = 10
POLL_S = 0.05


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))


def exists(probe: BlockingChannel, queue: str) -> bool:
    """A mandatory publish to the queue: returned (unroutable) once it is gone."""
    try:
        probe.basic_publish("", queue, b"probe", mandatory=True)
    except pika.exceptions.UnroutableError:
        return False
    return True


def wait_gone(probe: BlockingChannel, queue: str) -> float:
    """Poll until the queue is gone; returns when (monotonic)."""
    deadline = time.monotonic() + TIMEOUT_S
    while exists(probe, queue):
        assert time.monotonic() < deadline, f"{queue} did not expire"
        probe.connection.process_data_events(time_limit=POLL_S)
    return time.monotonic()


def probe_channel(conn: pika.BlockingConnection) -> BlockingChannel:
    probe = conn.channel()
    probe.confirm_delivery()
    return probe


def test_an_unused_queue_is_deleted_after_its_period(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    probe = probe_channel(conn)
    start = time.monotonic()
    channel.queue_declare("temp", arguments={"x-expires": 300})
    channel.queue_bind("temp", "amq.fanout")
    channel.basic_publish("", "temp", b"message")  # messages are no use
    assert time.monotonic() - start < 0.3 and exists(probe, "temp")
    gone = wait_gone(probe, "temp")
    assert gone - start >= 0.3
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.queue_declare("temp", passive=True)
    assert raised.value.reply_code == 404
    conn.close()


def test_consumers_basic_get_and_redeclares_are_uses(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    probe = probe_channel(conn)
    for name in ("consumed", "polled", "redeclared"):
        channel.queue_declare(name, arguments={"x-expires": 300})
    tag = channel.basic_consume("consumed", lambda *args: None, auto_ack=True)
    until = time.monotonic() + 0.8  # well past 300 ms
    while time.monotonic() < until:
        channel.basic_get("polled", auto_ack=True)
        channel.queue_declare("redeclared", arguments={"x-expires": 300})
        conn.process_data_events(time_limit=0.1)
    assert all(exists(probe, name) for name in ("consumed", "polled", "redeclared"))
    cancelled = time.monotonic()
    channel.basic_cancel(tag)  # the lease starts now
    assert wait_gone(probe, "consumed") - cancelled >= 0.3
    wait_gone(probe, "polled")
    wait_gone(probe, "redeclared")
    conn.close()


def test_the_policy_sets_expiry_and_the_smaller_wins(broker: RunningBroker) -> None:
    assert broker.put_policy("exp", {"pattern": "^exp", "definition": {"expires": 200}}) == 201
    assert broker.put_policy("zero", {"pattern": "^z", "definition": {"expires": 0}}) == 400
    conn = connect(broker)
    channel = conn.channel()
    probe = probe_channel(conn)
    start = time.monotonic()
    channel.queue_declare("exp-by-policy")
    channel.queue_declare("exp-argument", arguments={"x-expires": 60000})
    wait_gone(probe, "exp-by-policy")
    wait_gone(probe, "exp-argument")
    assert time.monotonic() - start < 60
    conn.close()


def test_a_restart_starts_the_lease_again(broker: RunningBroker) -> None:
    conn = connect(broker)
    conn.channel().queue_declare("durable-temp", durable=True, arguments={"x-expires": 700})
    conn.close()
    broker.stop()
    time.sleep(0.8)  # down for longer than the period
    # The lease starts during the broker's start, at some point after this: taken after
    # the start returns, the bound would depend on how long the start took.
    launched = time.monotonic()
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        probe = probe_channel(conn)
        assert exists(probe, "durable-temp")
        assert wait_gone(probe, "durable-temp") - launched >= 0.7
        conn.close()
    again = RunningBroker(broker.data_dir)  # the deletion was durable
    try:
        conn = connect(again)
        assert not exists(probe_channel(conn), "durable-temp")
        conn.close()
    finally:
        again.stop()


@pytest.mark.parametrize(
    ("value", "problem"),
    [(0, "{value_zero,0}"), (-5, "{value_negative,-5}"), ("a", '"expected integer, got longstr"')],
)
def test_a_bad_x_expires_is_406_in_rabbitmqs_words(
    broker: RunningBroker, value: object, problem: str
) -> None:
    conn = connect(broker)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        conn.channel().queue_declare("temp", arguments={"x-expires": value})
    assert raised.value.reply_code == 406
    assert raised.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-expires' for queue 'temp' in vhost '/': {problem}"
    )
    conn.close()


async def test_aio_pika_queue_expires(broker: RunningBroker) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await channel.declare_queue("aio-temp", arguments={"x-expires": 250})
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                await channel.default_exchange.publish(
                    aio_pika.Message(b"probe"), routing_key="aio-temp", mandatory=True
                )
            except aio_pika.exceptions.DeliveryError:
                break  # returned: the queue is gone
            assert time.monotonic() < deadline, "aio-temp did not expire"
            await asyncio.sleep(POLL_S)


@pytest.mark.parametrize("settle", ["ack", "requeue", "reject"])
def test_settling_after_the_queue_expired_leaves_other_queues_whole(
    broker: RunningBroker, settle: str
) -> None:
    """A message routed to two queues, taken unacked from the one that then expires:
    settling it afterwards must not release the copy the other queue still holds."""
    conn = connect(broker)
    channel = conn.channel()
    probe = probe_channel(conn)
    channel.exchange_declare("both", "fanout")
    for name, arguments in (("short", {"x-expires": 200}), ("long", {})):
        channel.queue_declare(name, arguments=arguments)
        channel.queue_bind(name, "both")
    channel.basic_publish("both", "", b"shared")
    method, _, body = channel.basic_get("short")
    assert body == b"shared"
    wait_gone(probe, "short")
    if settle == "ack":
        channel.basic_ack(method.delivery_tag)
    elif settle == "reject":
        channel.basic_reject(method.delivery_tag, requeue=False)
    else:
        channel.close()
        channel = conn.channel()
    assert channel.basic_get("long", auto_ack=True)[2] == b"shared"
    conn.close()
