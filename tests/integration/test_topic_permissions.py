"""Topic permissions enforced on real pika connections: publish (one by one and in runs),
queue.bind and exchange.bind, variable expansion, restart; and their management API."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from streamq.broker.accounts import AccountStore
from tests.integration.conftest import RunningBroker
from tests.integration.test_publish_runs import FRAME_MAX, Reader, publishes, received

TIMEOUT_S = 10
RUN_LENGTH = 200  # publishes in a row with one key: the run path (publishing.publish_run)


def refused_text(kind: str, key: str, exchange: str = "amq.topic", user: str = "bob") -> str:
    return (
        f"ACCESS_REFUSED - {kind} access to topic '{key}' in exchange '{exchange}' "
        f"in vhost '/' refused for user '{user}'"
    )


def make_store(data_dir: Path) -> AccountStore:
    store = AccountStore.open(str(data_dir))
    store.add_user("bob", "pw")
    store.set_permissions("bob", "/", ".*", ".*", ".*")
    store.add_user("carol", "pw")  # no topic permissions at all
    store.set_permissions("carol", "/", ".*", ".*", ".*")
    return store


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    store = make_store(tmp_path / "data")
    store.set_topic_permissions(
        "bob", "/", "amq.topic", "^tenant-a\\.", "^(tenant-a|{username})\\."
    )
    return tmp_path / "data"


@pytest.fixture
def broker(data_dir: Path) -> Iterator[RunningBroker]:
    running = RunningBroker(data_dir)
    yield running
    running.stop()


def connect(broker: RunningBroker, user: str = "bob") -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            broker.amqp_port,
            credentials=pika.PlainCredentials(user, "pw" if user != "guest" else "guest"),
            blocked_connection_timeout=TIMEOUT_S,
        )
    )


def bound_queue(ch: BlockingChannel, exchange: str = "amq.topic", key: str = "#") -> str:
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(queue, exchange, key)
    return queue


def count(ch: BlockingChannel, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def test_publish_allowed_key_is_routed_denied_key_closes_channel(broker: RunningBroker) -> None:
    with connect(broker, "guest") as admin, connect(broker) as conn:
        watch = admin.channel()
        queue = bound_queue(watch)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "tenant-a.orders", b"ok")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.basic_publish("amq.topic", "tenant-b.orders", b"no")
        assert refused.value.reply_code == 403
        assert refused.value.reply_text == refused_text("write", "tenant-b.orders")
        assert count(watch, queue) == 1


def open_raw_as(port: int, user: str, password: str) -> Reader:
    """A raw connection of `user` with channel 1 open (test_publish_runs.open_raw's)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    reader = Reader(sock)
    sock.sendall(b"AMQP\x00\x00\x09\x01")
    reader.until(received(m.ConnectionStart))
    response = f"\x00{user}\x00{password}".encode()
    start_ok = m.ConnectionStartOk(mechanism="PLAIN", response=response)
    sock.sendall(codec.encode_method_frame(codec.ChannelId(0), start_ok))
    reader.until(received(m.ConnectionTune))
    tune_ok = m.ConnectionTuneOk(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0)
    sock.sendall(codec.encode_method_frame(codec.ChannelId(0), tune_ok))
    sock.sendall(codec.encode_method_frame(codec.ChannelId(0), m.ConnectionOpen("/")))
    reader.until(received(m.ConnectionOpenOk))
    sock.sendall(codec.encode_method_frame(codec.ChannelId(1), m.ChannelOpen()))
    reader.until(received(m.ChannelOpenOk))
    reader.methods.clear()
    return reader


def test_runs_of_publishes_are_checked_per_key(broker: RunningBroker) -> None:
    """Publishes in a row with one key, written in one sendall, reach the broker as runs
    (the batched path, publishing.publish_run): an allowed run is stored whole, and a
    refused one stores nothing and closes the channel with RabbitMQ's text."""
    with connect(broker, "guest") as admin:
        watch = admin.channel()
        queue = bound_queue(watch)
        raw = open_raw_as(broker.amqp_port, "bob", "pw")
        raw.sock.sendall(
            publishes("amq.topic", "tenant-a.x", [b"m"] * RUN_LENGTH)
            + publishes("amq.topic", "tenant-z.x", [b"m"] * RUN_LENGTH)
        )
        [close] = [x for x in raw.until(received(m.ChannelClose)) if isinstance(x, m.ChannelClose)]
        raw.sock.close()
        assert (close.reply_code, close.class_id, close.method_id) == (403, 60, 40)
        assert close.reply_text == refused_text("write", "tenant-z.x")
        assert count(watch, queue) == RUN_LENGTH


def test_other_exchanges_and_users_are_not_restricted(broker: RunningBroker) -> None:
    with connect(broker, "guest") as admin:
        admin.channel().exchange_declare("other.topic", "topic")
    with connect(broker) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("other.topic", "anything", b"m")  # no topic permission on it
        ch.basic_publish("amq.direct", "tenant-b", b"m")  # not a topic exchange
    with connect(broker, "carol") as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "tenant-b.x", b"m")


def test_bind_checks_read_with_the_binding_key(broker: RunningBroker) -> None:
    with connect(broker) as conn:
        ch = conn.channel()
        queue = bound_queue(ch, key="tenant-a.#")
        ch.queue_bind(queue, "amq.topic", "bob.#")  # {username} expanded
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_bind(queue, "amq.topic", "tenant-b.#")
        assert refused.value.reply_code == 403
        assert refused.value.reply_text == refused_text("read", "tenant-b.#")
        ch = conn.channel()
        ch.exchange_declare("bob-x", "fanout", auto_delete=True)
        ch.exchange_bind("bob-x", "amq.topic", "tenant-a.y")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.exchange_bind("bob-x", "amq.topic", "z")
        assert refused.value.reply_text == refused_text("read", "z")
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_unbind(queue, "amq.topic", "tenant-c.#")
        assert refused.value.reply_text == refused_text("read", "tenant-c.#")


def test_variables_expand_to_the_user_and_vhost(tmp_path: Path) -> None:
    store = make_store(tmp_path / "data")
    store.set_topic_permissions("bob", "/", "amq.topic", "^{username}\\.{vhost}\\.", ".*")
    store.set_topic_permissions("carol", "/", "amq.topic", "^{client_id}$", ".*")
    running = RunningBroker(tmp_path / "data")
    try:
        with connect(running) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("amq.topic", "bob./.x", b"m")
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                ch.basic_publish("amq.topic", "carol./.x", b"m")
        with connect(running, "carol") as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            # AMQP 0-9-1 has no client_id variable in RabbitMQ: the text stays literal.
            ch.basic_publish("amq.topic", "{client_id}", b"m")
    finally:
        running.stop()


def test_topic_permissions_survive_restart(data_dir: Path) -> None:
    for _ in range(2):
        running = RunningBroker(data_dir)
        try:
            with connect(running) as conn:
                ch = conn.channel()
                ch.confirm_delivery()
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                    ch.basic_publish("amq.topic", "tenant-b.x", b"m")
                assert refused.value.reply_code == 403
        finally:
            running.stop()
