"""Message TTL and dead-lettering with pika: queue and per-message TTL, a TTL of 0 with
and without a consumer, reasons expired and rejected, the x-death header as RabbitMQ
writes it, a missing dead-letter exchange, a cycle, policies, and expiry across a restart
(the seed's scenario in small)."""

from __future__ import annotations

import time
from pathlib import Path

import pika
from pika.adapters.blocking_connection import BlockingChannel

from streamq.broker.accounts import AccountStore
from tests.integration.conftest import RunningBroker, broker_on, dead_letter_setup, poll_messages

TIMEOUT_S = 10


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def wait_for(channel: BlockingChannel, queue: str, count: int) -> list[tuple[object, bytes]]:
    """basic.get until `count` messages came (polling: expiry runs on a 200 ms timer)."""
    got = poll_messages(channel, queue, count, every_s=0.05, timeout_s=TIMEOUT_S)
    return [(properties, body) for _, properties, body in got]


def test_queue_ttl_dead_letters_with_x_death(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    dead_letter_setup(
        channel, "source", True, **{"x-message-ttl": 100, "x-dead-letter-exchange": "dlx"}
    )
    for n in range(5):
        channel.basic_publish("", "source", str(n).encode())
    got = wait_for(channel, "dead", 5)
    assert [body for _, body in got] == [b"0", b"1", b"2", b"3", b"4"]
    headers = got[0][0].headers  # type: ignore[attr-defined]
    [death] = headers["x-death"]
    assert {k: death[k] for k in ("count", "reason", "queue", "exchange", "routing-keys")} == {
        "count": 1,
        "reason": "expired",
        "queue": "source",
        "exchange": "",
        "routing-keys": ["source"],
    }
    assert headers["x-first-death-reason"] == "expired"
    assert headers["x-first-death-queue"] == "source"
    assert channel.basic_get("source")[0] is None
    conn.close()


def test_per_message_expiration_is_never_delivered(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("plain", durable=True)
    channel.basic_publish("", "plain", b"short", pika.BasicProperties(expiration="50"))
    channel.basic_publish("", "plain", b"long", pika.BasicProperties(expiration="60000"))
    time.sleep(0.1)  # past the first message's 50 ms
    _, properties, body = channel.basic_get("plain", auto_ack=True)
    assert body == b"long" and properties.expiration == "60000"
    assert channel.basic_get("plain")[0] is None
    conn.close()


def receive(conn: pika.BlockingConnection, got: list[object], count: int) -> None:
    """Process events until `got` (a consumer callback's list) holds `count` items."""
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} deliveries"
        conn.process_data_events(time_limit=0.05)


def test_ttl_zero_reaches_a_consumer_with_credit_and_otherwise_expires(
    broker: RunningBroker,
) -> None:
    """An expiration of 0 ("expired upon reaching a queue unless they can be delivered to
    a consumer immediately", RabbitMQ's TTL guide): a consumer with credit gets it; one at
    its prefetch limit does not, and it is dead-lettered with reason expired; without a
    consumer basic.get never returns it."""
    conn = connect(broker)
    publisher = conn.channel()
    dead_letter_setup(publisher, "now", **{"x-dead-letter-exchange": "dlx"})
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=1)
    got: list[tuple[int, bytes]] = []
    tag = consumer.basic_consume(
        "now", lambda _ch, method, _props, body: got.append((method.delivery_tag, body))
    )
    zero = pika.BasicProperties(expiration="0")
    publisher.basic_publish("", "now", b"caught", zero)
    receive(conn, got, 1)
    publisher.basic_publish("", "now", b"too late", zero)
    [(properties, body)] = wait_for(publisher, "dead", 1)
    assert body == b"too late"
    [death] = properties.headers["x-death"]  # type: ignore[attr-defined]
    assert (death["reason"], death["queue"], death["original-expiration"]) == (
        "expired",
        "now",
        "0",
    )
    consumer.basic_ack(got[0][0])
    conn.process_data_events(time_limit=0.3)
    assert got == [(1, b"caught")]
    consumer.basic_cancel(tag)
    publisher.basic_publish("", "now", b"nobody", zero)
    assert publisher.basic_get("now")[0] is None
    assert [body for _, body in wait_for(publisher, "dead", 1)] == [b"nobody"]
    conn.close()


def test_queue_ttl_zero_reaches_a_consumer_with_credit(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("ttl0", arguments={"x-message-ttl": 0})
    got: list[bytes] = []
    channel.basic_consume("ttl0", lambda _ch, _m, _p, body: got.append(body), auto_ack=True)
    for n in range(100):  # one read or a few: rounds of many messages
        channel.basic_publish("", "ttl0", b"%d" % n)
    receive(conn, got, 100)
    assert got == [b"%d" % n for n in range(100)]
    conn.close()


def test_rejected_messages_are_dead_lettered_and_without_dlx_dropped(
    broker: RunningBroker,
) -> None:
    conn = connect(broker)
    channel = conn.channel()
    dead_letter_setup(channel, "source", True, **{"x-dead-letter-exchange": "dlx"})
    channel.queue_declare("nodlx", durable=True)
    for queue in ("source", "nodlx"):
        channel.basic_publish("", queue, b"bad")
        method, _, _ = channel.basic_get(queue)
        channel.basic_reject(method.delivery_tag, requeue=False)
    [(properties, body)] = wait_for(channel, "dead", 1)
    assert body == b"bad"
    assert properties.headers["x-death"][0]["reason"] == "rejected"  # type: ignore[attr-defined]
    assert channel.queue_declare("nodlx", passive=True).method.message_count == 0
    conn.close()


def test_a_missing_dead_letter_exchange_drops_and_a_cycle_ends(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("lost", arguments={"x-message-ttl": 10, "x-dead-letter-exchange": "gone"})
    channel.exchange_declare("loop", "fanout")
    channel.queue_declare(
        "cycle", arguments={"x-message-ttl": 10, "x-dead-letter-exchange": "loop"}
    )
    channel.queue_bind("cycle", "loop")
    channel.basic_publish("", "lost", b"x")
    channel.basic_publish("", "cycle", b"y")
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        counts = [
            channel.queue_declare(q, passive=True).method.message_count for q in ("lost", "cycle")
        ]
        if counts == [0, 0]:
            break
        conn.process_data_events(time_limit=0.05)
    assert counts == [0, 0]  # expired, then dropped: no DLX, and a cycle without rejection
    conn.close()


def test_ttl_and_dead_lettering_by_policy(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    dead_letter_setup(channel, "source", True)
    policy = {
        "pattern": "^source$",
        "definition": {"message-ttl": 50, "dead-letter-exchange": "dlx"},
    }
    assert broker.put_policy("ttl", policy) == 201
    channel.basic_publish("", "source", b"p")
    assert [body for _, body in wait_for(channel, "dead", 1)] == [b"p"]
    conn.close()


def test_messages_expire_across_a_restart(broker: RunningBroker) -> None:
    """The broker is down for longer than the TTL: at restart, before any client asks,
    every message goes to its dead-letter queue, none is dropped."""
    conn = connect(broker)
    channel = conn.channel()
    dead_letter_setup(
        channel, "source", True, **{"x-message-ttl": 300, "x-dead-letter-exchange": "dlx"}
    )
    channel.confirm_delivery()
    for n in range(20):
        channel.basic_publish("", "source", str(n).encode())
    conn.close()
    broker.stop()
    time.sleep(0.4)
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        got = wait_for(conn.channel(), "dead", 20)
        assert sorted(int(body) for _, body in got) == list(range(20))
        conn.close()


def test_the_seed_scenario_several_hops_and_vhosts_stopped_longer_than_the_ttl(
    tmp_path: Path,
) -> None:
    """The bug report the project started from: queues with TTLs dead-letter through
    exchanges into other queues, in two vhosts; some messages are delivered but unacked
    when the broker stops for longer than the TTLs; it restarts under publishing load.
    Every message must reach the last queue of its chain, none dropped: expiry only runs
    once the bindings it routes through are loaded."""
    data_dir = tmp_path / "data"
    store = AccountStore.open(str(data_dir))
    store.add_vhost("other")
    store.set_permissions("guest", "other", ".*", ".*", ".*")
    broker = RunningBroker(data_dir)
    for vhost in ("/", "other"):
        conn = vhost_connection(broker, vhost)
        ch = conn.channel()
        ch.exchange_declare("hop1", "direct", durable=True)
        ch.exchange_declare("hop2", "fanout", durable=True)
        ttl = {"x-message-ttl": 300}
        ch.queue_declare("first", durable=True, arguments={**ttl, "x-dead-letter-exchange": "hop1"})
        ch.queue_declare(
            "second", durable=True, arguments={**ttl, "x-dead-letter-exchange": "hop2"}
        )
        ch.queue_declare("last", durable=True)
        ch.queue_bind("second", "hop1", "first")  # dead letters keep their routing key
        ch.queue_bind("last", "hop2")
        ch.confirm_delivery()
        for n in range(50):
            ch.basic_publish("", "first", f"{vhost}-{n}".encode())
        for _ in range(5):  # in flight: delivered, not acked when the broker stops
            assert ch.basic_get("first")[0] is not None
        conn.close()
    broker.stop()
    time.sleep(0.7)  # longer than both TTLs together
    with broker_on(data_dir) as restarted:
        load = vhost_connection(restarted, "/")
        load_channel = load.channel()
        load_channel.queue_declare("busy", durable=True)
        for _ in range(2000):  # publishing load while the chains expire
            load_channel.basic_publish("", "busy", b"load")
        for vhost in ("/", "other"):
            conn = vhost_connection(restarted, vhost)
            got = wait_for(conn.channel(), "last", 50)
            assert sorted(body for _, body in got) == sorted(
                f"{vhost}-{n}".encode() for n in range(50)
            )
            reasons = [d["reason"] for d in got[0][0].headers["x-death"]]  # type: ignore[attr-defined]
            assert reasons == ["expired", "expired"]
            conn.close()
        load.close()


def vhost_connection(broker: RunningBroker, vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", broker.amqp_port, vhost, blocked_connection_timeout=10
        )
    )
