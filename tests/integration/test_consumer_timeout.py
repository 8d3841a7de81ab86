"""Consumer timeout with pika and aio-pika: a delivery left unacked longer than the timeout
(queue argument x-consumer-timeout, policy consumer-timeout, consumer argument, or the
broker's --consumer-timeout-ms) closes its channel with RabbitMQ's 406 and requeues the
channel's unacked messages; acks in time keep the channel open. Timeouts are a few
hundred ms, checked by the broker's 200 ms housekeeping tick."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aio_pika
import pika
import pytest
import uvloop
from pika.adapters.blocking_connection import BlockingChannel

from streamq.app import ServeConfig, run_broker
from streamq.broker.broker import Broker
from streamq.cli import build_parser, given_flags
from streamq.config import resolve
from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10
TICK_S = 0.2  # the broker's housekeeping interval


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))


def timeout_text(channel: int, timeout_ms: int) -> str:
    return (
        f"PRECONDITION_FAILED - delivery acknowledgement on channel {channel} timed out. "
        f"Timeout value used: {timeout_ms} ms. This timeout value can be configured, see "
        "consumers doc guide to learn more"
    )


def consume_without_ack(
    channel: BlockingChannel, queue: str, arguments: dict[str, object] | None = None
) -> tuple[pika.exceptions.ChannelClosedByBroker, float, list[bytes]]:
    """Consume and never ack until the broker closes the channel; returns the close, the
    seconds from the first delivery to it, and what was delivered."""
    got: list[bytes] = []
    first: list[float] = []

    def on_message(ch: BlockingChannel, method: object, properties: object, body: bytes) -> None:
        first.append(time.monotonic())
        got.append(body)

    channel.basic_consume(queue, on_message, arguments=arguments)
    channel.connection.call_later(TIMEOUT_S, channel.stop_consuming)  # a bound, not a wait
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.start_consuming()
    return raised.value, time.monotonic() - first[0], got


def test_queue_argument_closes_the_channel_and_requeues(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("slow", arguments={"x-consumer-timeout": 300})
    for body in (b"a", b"b"):
        channel.basic_publish("", "slow", body)
    closed, elapsed_s, got = consume_without_ack(channel, "slow")
    assert got == [b"a", b"b"]
    assert closed.reply_code == 406
    assert closed.reply_text == timeout_text(channel.channel_number, 300)
    assert 0.3 <= elapsed_s < 0.3 + TIMEOUT_S / 2
    other = conn.channel()
    method, _, body = other.basic_get("slow", auto_ack=True)
    assert (body, method.redelivered) == (b"a", True)  # requeued in order
    assert other.basic_get("slow", auto_ack=True)[2] == b"b"
    conn.close()


def test_policy_and_consumer_argument(broker: RunningBroker) -> None:
    policy = {"pattern": "^pol", "definition": {"consumer-timeout": 200}}
    assert broker.put_policy("timeout", policy) == 201
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("pol", arguments={"x-consumer-timeout": 60000})  # the smaller wins
    channel.basic_publish("", "pol", b"x")
    closed, _, _ = consume_without_ack(channel, "pol")
    assert closed.reply_text == timeout_text(channel.channel_number, 200)
    second = conn.channel()
    second.queue_declare("long", arguments={"x-consumer-timeout": 60000})
    second.basic_publish("", "long", b"y")
    closed, _, _ = consume_without_ack(second, "long", {"x-consumer-timeout": 250})
    assert closed.reply_text == timeout_text(second.channel_number, 250)  # consumer's first
    conn.close()


def test_acks_in_time_keep_the_channel_open(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("fast", arguments={"x-consumer-timeout": 400})
    channel.basic_qos(prefetch_count=1)
    for n in range(8):
        channel.basic_publish("", "fast", str(n).encode())
    acked: list[bytes] = []

    def on_message(ch: BlockingChannel, method: object, properties: object, body: bytes) -> None:
        # Each delivery waits 100 ms for its ack: 800 ms in all, twice the timeout.
        ch.connection.call_later(0.1, lambda: ch.basic_ack(method.delivery_tag))  # type: ignore[attr-defined]
        acked.append(body)

    channel.basic_consume("fast", on_message)
    deadline = time.monotonic() + TIMEOUT_S
    while len(acked) < 8 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=TICK_S * 2)
    assert len(acked) == 8 and channel.is_open
    conn.close()


def test_a_bad_consumer_timeout_is_406(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.queue_declare("bad", arguments={"x-consumer-timeout": -1})
    assert raised.value.reply_text == (
        "PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for queue 'bad' in vhost '/': "
        "{value_negative,-1}"
    )
    channel = conn.channel()
    channel.queue_declare("ok")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.basic_consume("ok", lambda *args: None, arguments={"x-consumer-timeout": "1"})
    assert raised.value.reply_code == 406
    conn.close()


class ShortTimeoutBroker(RunningBroker):
    """A broker started as `streamq serve --consumer-timeout-ms 300` would be."""

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(amqp_port: int, http_port: int) -> None:
                self.amqp_port, self.http_port = amqp_port, http_port
                self._ready.set()

            def keep(broker: Broker) -> None:
                self.broker = broker

            config = ServeConfig(
                str(self.data_dir),
                "127.0.0.1",
                0,
                0,
                consumer_timeout_ms=300,
                stream_port=-1,
                mqtt_port=-1,
            )
            await run_broker(config, self._stop, ready, keep)

        try:
            uvloop.run(main())
        except BaseException as exc:
            self.error = exc
            self._ready.set()


def test_the_broker_default_covers_basic_get_too(tmp_path: Path) -> None:
    running = ShortTimeoutBroker(tmp_path / "data")
    try:
        conn = connect(running)
        channel = conn.channel()
        channel.queue_declare("q")
        channel.basic_publish("", "q", b"got")
        assert channel.basic_get("q")[2] == b"got"  # unacked
        deadline = time.monotonic() + TIMEOUT_S
        while channel.is_open and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert not channel.is_open
        assert conn.channel().basic_get("q", auto_ack=True)[2] == b"got"
        conn.close()
    finally:
        running.stop()


def test_the_command_line_option() -> None:
    parser = build_parser()

    def timeout_ms(*argv: str) -> object:
        return resolve(given_flags(parser.parse_args(["serve", *argv])), {}).value(
            "consumer_timeout_ms"
        )

    assert timeout_ms() == 1_800_000  # RabbitMQ's
    assert timeout_ms("--consumer-timeout-ms", "0") == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--consumer-timeout-ms", "-5"])


async def test_aio_pika_channel_is_closed_with_406(broker: RunningBroker) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("aio-slow", arguments={"x-consumer-timeout": 300})
        await channel.default_exchange.publish(aio_pika.Message(b"m"), routing_key="aio-slow")
        closed: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        channel.close_callbacks.add(
            lambda _, exc: closed.done() or closed.set_result(exc)  # type: ignore[func-returns-value]
        )
        delivered: list[bytes] = []

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            delivered.append(message.body)  # and never acked

        await queue.consume(on_message)
        reason = await asyncio.wait_for(closed, TIMEOUT_S)
        assert delivered == [b"m"]
        assert isinstance(reason, aio_pika.exceptions.ChannelPreconditionFailed)
        assert "delivery acknowledgement on channel" in str(reason)
        again = await connection.channel()
        message = await (await again.get_queue("aio-slow")).get(timeout=TIMEOUT_S)
        assert message.redelivered and message.body == b"m"
        await message.ack()
