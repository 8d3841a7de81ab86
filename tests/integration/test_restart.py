"""Restarts of a real broker on the same data directory, driven by pika.

Durable entities and the messages of durable queues come back after a graceful restart
and after SIGKILL; transient and exclusive queues do not, and leave no files; acked
messages never come back; unacked ones come back once, marked redelivered.
"""

from __future__ import annotations

from pathlib import Path

import pika
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.broker_process import BrokerProcess
from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=TIMEOUT_S)
    )


def get_all(channel: BlockingChannel, queue: str, ack: bool = True) -> list[tuple[bytes, bool]]:
    """Every ready message of `queue` as (body, redelivered), by basic.get."""
    got = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=ack)
        if method is None:
            return got
        got.append((body, method.redelivered))


def restart(broker: RunningBroker) -> RunningBroker:
    broker.stop()
    return RunningBroker(broker.data_dir)


def journal_files(data_dir: Path) -> list[str]:
    return sorted(p.name for p in data_dir.glob("vhosts/*/queues/*"))


def test_durable_queue_keeps_its_messages_and_transient_ones_go(broker: RunningBroker) -> None:
    with connect(broker.amqp_port) as conn:
        ch = conn.channel()
        ch.queue_declare("durable-q", durable=True)
        ch.queue_declare("transient-q", durable=False)
        ch.queue_declare("exclusive-q", durable=True, exclusive=True)
        for n in range(5):
            # delivery_mode 1 and 2 alike survive in a durable queue (as LavinMQ)
            props = pika.BasicProperties(delivery_mode=1 + n % 2, message_id=f"m{n}")
            for queue in ("durable-q", "transient-q", "exclusive-q"):
                ch.basic_publish("", queue, f"{queue}-{n}".encode(), props)
        ch.queue_declare("durable-q", passive=True)
    assert len(journal_files(broker.data_dir)) == 1
    broker = restart(broker)
    try:
        with connect(broker.amqp_port) as conn:
            ch = conn.channel()
            declared = ch.queue_declare("durable-q", durable=True)
            assert declared.method.message_count == 5
            method, props, body = ch.basic_get("durable-q", auto_ack=True)
            assert body == b"durable-q-0" and props.message_id == "m0"
            assert not method.redelivered
            assert [b for b, _ in get_all(ch, "durable-q")] == [
                f"durable-q-{n}".encode() for n in range(1, 5)
            ]
        for gone in ("transient-q", "exclusive-q"):
            with connect(broker.amqp_port) as conn:
                ch = conn.channel()
                try:
                    ch.queue_declare(gone, passive=True)
                    raise AssertionError(f"{gone} survived a restart")
                except pika.exceptions.ChannelClosedByBroker as exc:
                    assert exc.reply_code == 404
        assert len(journal_files(broker.data_dir)) == 1
    finally:
        broker.stop()


def test_acked_messages_stay_gone_and_unacked_come_back_redelivered(
    broker: RunningBroker,
) -> None:
    with connect(broker.amqp_port) as conn:
        ch = conn.channel()
        ch.queue_declare("work", durable=True)
        for n in range(6):
            ch.basic_publish("", "work", str(n).encode())
        ch.confirm_delivery()  # a sync point: publishes before it are on disk
        ch.basic_publish("", "work", b"6")
        taken = []
        for _ in range(4):
            method, _, body = ch.basic_get("work", auto_ack=False)
            assert method is not None
            taken.append((method.delivery_tag, body))
        assert [body for _, body in taken] == [b"0", b"1", b"2", b"3"]
        ch.basic_ack(taken[0][0])
        ch.basic_ack(taken[2][0])
        ch.basic_nack(taken[3][0], requeue=True)  # "3" back, delivered once
        # "1" stays unacked until the connection closes
    broker = restart(broker)
    try:
        with connect(broker.amqp_port) as conn:
            ch = conn.channel()
            got = get_all(ch, "work")
            assert got == [
                (b"1", True),
                (b"3", True),
                (b"4", False),
                (b"5", False),
                (b"6", False),
            ]
    finally:
        broker.stop()


def test_durable_exchanges_and_bindings_survive_and_transient_ones_do_not(
    broker: RunningBroker,
) -> None:
    with connect(broker.amqp_port) as conn:
        ch = conn.channel()
        ch.exchange_declare("orders", "topic", durable=True)
        ch.exchange_declare("audit", "fanout", durable=True)
        ch.exchange_declare("scratch", "fanout", durable=False)
        ch.queue_declare("eu", durable=True)
        ch.queue_declare("all", durable=True)
        ch.queue_declare("temp", durable=False)
        ch.queue_bind("eu", "orders", "eu.#")
        ch.queue_bind("temp", "orders", "#")
        ch.exchange_bind("audit", "orders", "#")  # exchange to exchange
        ch.queue_bind("all", "audit")
        ch.queue_bind("all", "amq.direct", "x")
        ch.queue_bind("eu", "orders", "old.#")
        ch.queue_unbind("eu", "orders", "old.#")
    broker = restart(broker)
    try:
        with connect(broker.amqp_port) as conn:
            ch = conn.channel()
            ch.exchange_declare("orders", "topic", durable=True, passive=True)
            ch.basic_publish("orders", "eu.de", b"a")
            ch.basic_publish("orders", "old.x", b"b")
            ch.basic_publish("amq.direct", "x", b"c")
            assert get_all(ch, "eu") == [(b"a", False)]
            assert get_all(ch, "all") == [(b"a", False), (b"b", False), (b"c", False)]
            try:
                ch.exchange_declare("scratch", "fanout", passive=True)
                raise AssertionError("a transient exchange survived a restart")
            except pika.exceptions.ChannelClosedByBroker as exc:
                assert exc.reply_code == 404
    finally:
        broker.stop()


def test_deleted_and_purged_queues_stay_so(broker: RunningBroker) -> None:
    with connect(broker.amqp_port) as conn:
        ch = conn.channel()
        for name in ("doomed", "purged"):
            ch.queue_declare(name, durable=True)
            for n in range(3):
                ch.basic_publish("", name, str(n).encode())
        assert ch.queue_purge("purged").method.message_count == 3
        ch.basic_publish("", "purged", b"after purge")
        ch.queue_delete("doomed")
    assert len(journal_files(broker.data_dir)) == 1
    broker = restart(broker)
    try:
        with connect(broker.amqp_port) as conn:
            ch = conn.channel()
            assert get_all(ch, "purged") == [(b"after purge", False)]
            declared = ch.queue_declare("doomed", durable=True)
            assert declared.method.message_count == 0
    finally:
        broker.stop()


def test_confirmed_messages_and_declared_queues_survive_sigkill(tmp_path: Path) -> None:
    """The promise behind confirms and Declare-Ok: once the client has them, SIGKILL
    cannot take the queue or the messages away."""
    process = BrokerProcess(tmp_path / "data")
    try:
        conn = connect(process.amqp_port)
        ch = conn.channel()
        ch.exchange_declare("ex", "direct", durable=True)
        ch.queue_declare("kept", durable=True)
        ch.queue_bind("kept", "ex", "k")
        ch.confirm_delivery()
        for n in range(200):
            ch.basic_publish("ex", "k", str(n).encode())  # returns once confirmed
        process.kill()  # the connection is left to die with the broker
        process = BrokerProcess(tmp_path / "data")
        with connect(process.amqp_port) as conn:
            ch = conn.channel()
            got = get_all(ch, "kept")
            assert [b for b, _ in got] == [str(n).encode() for n in range(200)]
    finally:
        process.stop()


def test_declare_ok_means_on_disk(tmp_path: Path) -> None:
    """SIGKILL right after the Declare-Ok and Bind-Ok: the queue, exchange and binding
    are there after the restart (no other sync round had a chance to run: the broker's
    periodic flush waits 200 ms)."""
    process = BrokerProcess(tmp_path / "data")
    try:
        conn = connect(process.amqp_port)
        ch = conn.channel()
        ch.exchange_declare("fresh-ex", "fanout", durable=True)
        ch.queue_declare("fresh-q", durable=True, arguments={"x-note": "kept"})
        ch.queue_bind("fresh-q", "fresh-ex")
        process.kill()
        process = BrokerProcess(tmp_path / "data")
        with connect(process.amqp_port) as conn:
            ch = conn.channel()
            ch.queue_declare("fresh-q", durable=True, arguments={"x-note": "kept"})
            ch.basic_publish("fresh-ex", "", b"routed")
            assert get_all(ch, "fresh-q") == [(b"routed", False)]
    finally:
        process.stop()


def test_delivery_counts_survive_a_restart(broker: RunningBroker) -> None:
    """Each redelivery carries x-delivery-count (deliveries before it); the count is in
    the queue journal, so a restart does not reset it (LavinMQ loses it)."""
    for expected in (None, 1):
        with connect(broker.amqp_port) as conn:
            ch = conn.channel()
            ch.queue_declare("counted", durable=True)
            if expected is None:
                ch.basic_publish("", "counted", b"again")
            method, properties, _ = ch.basic_get("counted")
            assert method is not None
            assert (properties.headers or {}).get("x-delivery-count") == expected
        # closing the connection requeues the unacked message
    broker = restart(broker)
    try:
        with connect(broker.amqp_port) as conn:
            method, properties, body = conn.channel().basic_get("counted", auto_ack=True)
            assert method is not None and method.redelivered and body == b"again"
            assert properties.headers["x-delivery-count"] == 2
    finally:
        broker.stop()
