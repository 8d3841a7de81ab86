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


def refused_text(key: str, exchange: str = "amq.topic", user: str = "bob") -> str:
    return (
        f"ACCESS_REFUSED - access to topic '{key}' in exchange '{exchange}' "
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
        assert refused.value.reply_text == refused_text("tenant-b.orders")
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
        assert close.reply_text == refused_text("tenant-z.x")
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


def test_a_delayed_exchange_routing_as_topic_is_not_checked(data_dir: Path) -> None:
    """RabbitMQ checks the exchange record's type, x-delayed-message here, not the type
    it routes as."""
    AccountStore.open(str(data_dir)).set_topic_permissions("bob", "/", "later", "^no$", "^no$")
    running = RunningBroker(data_dir)
    try:
        with connect(running) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            arguments = {"x-delayed-type": "topic"}
            ch.exchange_declare("later", "x-delayed-message", arguments=arguments)
            queue = bound_queue(ch, "later", "a.#")
            ch.basic_publish("later", "a.1", b"m")
            ch.queue_unbind(queue, "later", "a.#")
    finally:
        running.stop()


def test_bind_checks_read_with_the_binding_key(broker: RunningBroker) -> None:
    with connect(broker) as conn:
        ch = conn.channel()
        queue = bound_queue(ch, key="tenant-a.#")
        ch.queue_bind(queue, "amq.topic", "bob.#")  # {username} expanded
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_bind(queue, "amq.topic", "tenant-b.#")
        assert refused.value.reply_code == 403
        assert refused.value.reply_text == refused_text("tenant-b.#")
        ch = conn.channel()
        ch.exchange_declare("bob-x", "fanout", auto_delete=True)
        ch.exchange_bind("bob-x", "amq.topic", "tenant-a.y")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.exchange_bind("bob-x", "amq.topic", "z")
        assert refused.value.reply_text == refused_text("z")
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_unbind(queue, "amq.topic", "tenant-c.#")
        assert refused.value.reply_text == refused_text("tenant-c.#")


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


# The management API.

PAIR = "/api/topic-permissions/%2F/bob"
ON_TOPIC = {"exchange": "amq.topic", "write": "^w\\.", "read": "^r\\."}


def http(
    broker: RunningBroker, method: str, path: str, body: object = None, user: str = "guest"
) -> tuple[int, object]:
    password = "guest" if user == "guest" else "pw"
    status, parsed, _ = broker.http(method, path, body, user=user, password=password)
    return status, parsed


@pytest.fixture
def plain_broker(tmp_path: Path) -> Iterator[RunningBroker]:
    store = make_store(tmp_path / "data")
    store.add_user("mgr", "pw", ["management"])
    store.set_permissions("mgr", "/", ".*", ".*", ".*")
    running = RunningBroker(tmp_path / "data")
    yield running
    running.stop()


def test_http_put_get_list_and_delete(plain_broker: RunningBroker) -> None:
    assert http(plain_broker, "GET", PAIR)[0] == 404
    assert http(plain_broker, "PUT", PAIR, ON_TOPIC)[0] == 201
    assert http(plain_broker, "PUT", PAIR, ON_TOPIC)[0] == 204
    assert http(plain_broker, "PUT", PAIR, {**ON_TOPIC, "exchange": "x"})[0] == 204
    expected = [
        {"user": "bob", "vhost": "/", **ON_TOPIC},
        {"user": "bob", "vhost": "/", **ON_TOPIC, "exchange": "x"},
    ]
    for path in (
        PAIR,
        "/api/topic-permissions",
        "/api/users/bob/topic-permissions",
        "/api/vhosts/%2F/topic-permissions",
    ):
        assert http(plain_broker, "GET", path) == (200, expected), path
    with connect(plain_broker) as conn:  # the API's change applies to a new connection
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "w.1", b"m")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            ch.basic_publish("amq.topic", "r.1", b"m")
    # As RabbitMQ 3.10: DELETE clears every exchange's, whatever exchange is asked for.
    assert http(plain_broker, "DELETE", PAIR + "?exchange=x")[0] == 204
    assert http(plain_broker, "GET", PAIR)[0] == 404
    assert http(plain_broker, "GET", "/api/topic-permissions") == (200, [])
    assert http(plain_broker, "DELETE", PAIR)[0] == 404


def test_http_unknown_names_bad_bodies_and_rights(plain_broker: RunningBroker) -> None:
    assert http(plain_broker, "GET", "/api/users/nobody/topic-permissions")[0] == 404
    assert http(plain_broker, "GET", "/api/vhosts/nope/topic-permissions")[0] == 404
    assert http(plain_broker, "GET", "/api/topic-permissions/nope/bob")[0] == 404
    assert http(plain_broker, "GET", "/api/topic-permissions/%2F/nobody")[0] == 404
    for path in ("/api/topic-permissions/%2F/nobody", "/api/topic-permissions/nope/bob"):
        assert http(plain_broker, "PUT", path, ON_TOPIC) == (
            400,
            {"error": "bad_request", "reason": "vhost_or_user_not_found"},
        )
    status, body = http(plain_broker, "PUT", PAIR, {**ON_TOPIC, "write": "(["})
    assert status == 400 and "invalid write regex" in str(body)
    status, body = http(plain_broker, "PUT", PAIR, {"write": "a", "read": "b"})
    assert (status, body) == (400, {"error": "bad_request", "reason": "[{key_missing,exchange}]"})
    assert http(plain_broker, "PUT", PAIR, {**ON_TOPIC, "read": 1})[0] == 400
    assert http(plain_broker, "GET", "/api/topic-permissions") == (200, [])
    for method, path in (
        ("GET", "/api/topic-permissions"),
        ("GET", PAIR),
        ("PUT", PAIR),
        ("DELETE", PAIR),
        ("GET", "/api/users/bob/topic-permissions"),
        ("GET", "/api/vhosts/%2F/topic-permissions"),
    ):
        # streamq answers 403 for a lack of rights, 401 for bad credentials only.
        assert http(plain_broker, method, path, ON_TOPIC, user="mgr")[0] == 403, path
        status, _, _ = plain_broker.http(method, path, ON_TOPIC, user="guest", password="bad")
        assert status == 401


def test_http_deleting_the_user_drops_its_topic_permissions(plain_broker: RunningBroker) -> None:
    assert http(plain_broker, "PUT", PAIR, ON_TOPIC)[0] == 201
    assert http(plain_broker, "DELETE", "/api/users/bob")[0] == 204
    assert http(plain_broker, "PUT", "/api/users/bob", {"password": "pw", "tags": ""})[0] == 201
    assert http(plain_broker, "GET", "/api/users/bob/topic-permissions") == (200, [])


def test_http_publish_and_bindings_check_topic_permissions(plain_broker: RunningBroker) -> None:
    assert http(plain_broker, "PUT", PAIR, ON_TOPIC)[0] == 201
    assert (
        http(plain_broker, "PUT", "/api/users/bob", {"password": "pw", "tags": "management"})[0]
        == 204
    )
    message = {"payload": "x", "payload_encoding": "string", "properties": {}}
    publish = "/api/exchanges/%2F/amq.topic/publish"
    assert http(plain_broker, "POST", publish, {**message, "routing_key": "w.1"}, "bob")[0] == 200
    status, body = http(plain_broker, "POST", publish, {**message, "routing_key": "r.1"}, "bob")
    assert status == 403 and "access to topic 'r.1' in exchange 'amq.topic'" in str(body)
    assert http(plain_broker, "PUT", "/api/queues/%2F/bq", {}, "bob")[0] == 201
    bind = "/api/bindings/%2F/e/amq.topic/q/bq"
    assert http(plain_broker, "POST", bind, {"routing_key": "r.1"}, "bob")[0] == 201
    assert http(plain_broker, "POST", bind, {"routing_key": "w.1"}, "bob")[0] == 403


def test_definitions_import_and_export_topic_permissions(plain_broker: RunningBroker) -> None:
    entry = {"user": "bob", "vhost": "/", **ON_TOPIC}
    document = {"topic_permissions": [entry]}
    assert http(plain_broker, "POST", "/api/definitions", document)[0] in (200, 204)
    assert http(plain_broker, "POST", "/api/definitions", document)[0] in (200, 204)
    status, exported = http(plain_broker, "GET", "/api/definitions")
    assert status == 200 and isinstance(exported, dict)
    assert exported["topic_permissions"] == [entry]
    with connect(plain_broker) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            ch.basic_publish("amq.topic", "r.1", b"m")
    missing = {"topic_permissions": [{**entry, "user": "nobody"}]}
    assert http(plain_broker, "POST", "/api/definitions", missing)[0] == 400
