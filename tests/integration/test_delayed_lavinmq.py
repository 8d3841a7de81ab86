"""LavinMQ's way to delay, with pika: an ordinary exchange (direct, fanout, topic,
headers) declared with `x-delayed-exchange: true`, or matched by a policy with
`delayed-message: true`, holds a message with `x-delay` for that many ms, then routes it
by its own type; a held message counts as routed (no basic.return) and is delivered
without `x-delay`; persistent held messages of a durable exchange survive a restart.
Beside it, what RabbitMQ's plugin does to `x-delay` (`swap_delay_header`: it becomes
`-delay` on delivery) and which `x-delay` values it reads (`get_delay`)."""

from __future__ import annotations

import time
from decimal import Decimal

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker, broker_on, poll_messages

TIMEOUT_S = 10
LAVINMQ_DELAYED = {"x-delayed-exchange": True}


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def collect(
    channel: BlockingChannel, queue: str, count: int
) -> list[tuple[float, bytes, dict[str, object]]]:
    """(arrival time, body, headers) of `count` messages, polling every 10 ms."""
    got = poll_messages(channel, queue, count, timeout_s=TIMEOUT_S)
    return [(arrived, body, dict(properties.headers or {})) for arrived, properties, body in got]


def delayed(delay: object, persistent: bool = True, **headers: object) -> pika.BasicProperties:
    return pika.BasicProperties(
        headers={"x-delay": delay, **headers}, delivery_mode=2 if persistent else 1
    )


def http_call(broker: RunningBroker, method: str, path: str, body: object = None) -> int:
    return broker.http(method, path, body)[0]


DELAYED_POLICY = {
    "pattern": "^pol-",
    "apply-to": "exchanges",
    "definition": {"delayed-message": True},
}


@pytest.mark.parametrize("kind", ["direct", "fanout", "topic", "headers"])
def test_argument_delays_any_ordinary_type(broker: RunningBroker, kind: str) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.exchange_declare("later", kind, arguments=LAVINMQ_DELAYED)
    channel.queue_declare("due")
    binding = {"x-match": "all", "to": "due"} if kind == "headers" else None
    channel.queue_bind("due", "later", "k.x", arguments=binding)
    start = time.monotonic()
    channel.basic_publish("later", "k.x", b"200", delayed(200, to="due"))
    channel.basic_publish("later", "k.x", b"80", delayed(80, to="due"))
    channel.basic_publish("later", "k.x", b"now", pika.BasicProperties(headers={"to": "due"}))
    got = collect(channel, "due", 3)
    assert [body for _, body, _ in got] == [b"now", b"80", b"200"]
    assert got[1][0] - start >= 0.08 and got[2][0] - start >= 0.2
    assert got[2][0] - start < 0.2 + 1.0
    assert all("x-delay" not in headers for _, _, headers in got)  # LavinMQ drops it
    assert got[1][2] == {"to": "due"}
    conn.close()


def test_held_message_counts_as_routed(broker: RunningBroker) -> None:
    """LavinMQ puts a held message in the exchange's delay queue: routed, so a mandatory
    publish is not returned (RabbitMQ's plugin returns it, see test_delayed.py)."""
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.exchange_declare("later", "direct", arguments=LAVINMQ_DELAYED)
    channel.queue_declare("due")
    channel.queue_bind("due", "later", "k")
    channel.basic_publish("later", "k", b"m", delayed(50), mandatory=True)  # no UnroutableError
    assert [body for _, body, _ in collect(channel, "due", 1)] == [b"m"]
    with pytest.raises(pika.exceptions.UnroutableError):  # an undelayed one still is
        channel.basic_publish("later", "nowhere", b"x", mandatory=True)
    conn.close()


def test_argument_must_be_a_boolean_true(broker: RunningBroker) -> None:
    """LavinMQ reads the argument `as?(Bool)`: the string "true" does not delay."""
    conn = connect(broker)
    channel = conn.channel()
    channel.exchange_declare("not-later", "direct", arguments={"x-delayed-exchange": "true"})
    channel.queue_declare("due")
    channel.queue_bind("due", "not-later", "k")
    channel.basic_publish("not-later", "k", b"m", delayed(5000))
    assert [body for _, body, _ in collect(channel, "due", 1)] == [b"m"]
    conn.close()


def test_policy_turns_delaying_on_and_off(broker: RunningBroker) -> None:
    """The policy key applies to existing exchanges at once; messages held while it was in
    force are still released after it is cleared, later ones are routed at once."""
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.exchange_declare("pol-x", "fanout")
    channel.queue_declare("due")
    channel.queue_bind("due", "pol-x")
    assert http_call(broker, "PUT", "/api/policies/%2F/delay", DELAYED_POLICY) == 201
    start = time.monotonic()
    channel.basic_publish("pol-x", "", b"held", delayed(300))
    time.sleep(0.05)
    assert channel.basic_get("due")[0] is None
    assert http_call(broker, "DELETE", "/api/policies/%2F/delay") == 204
    channel.basic_publish("pol-x", "", b"at-once", delayed(300))
    got = collect(channel, "due", 2)
    assert [body for _, body, _ in got] == [b"at-once", b"held"]
    assert got[0][2]["x-delay"] == 300  # not a delayed exchange now: untouched
    assert got[1][0] - start >= 0.3
    conn.close()


def test_policy_value_must_be_a_boolean(broker: RunningBroker) -> None:
    bad = {**DELAYED_POLICY, "definition": {"delayed-message": "yes"}}
    assert http_call(broker, "PUT", "/api/policies/%2F/delay", bad) == 400


def test_held_messages_survive_a_restart(broker: RunningBroker) -> None:
    """Durable exchanges, one delaying by argument and one by policy; persistent
    messages due while the broker is down and after it is back; a transient one is
    lost, as in test_delayed.py."""
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    assert http_call(broker, "PUT", "/api/policies/%2F/delay", DELAYED_POLICY) == 201
    channel.exchange_declare("later", "topic", durable=True, arguments=LAVINMQ_DELAYED)
    channel.exchange_declare("pol-later", "direct", durable=True)
    channel.queue_declare("due", durable=True)
    channel.queue_bind("due", "later", "job.#")
    channel.queue_bind("due", "pol-later", "k")
    start = time.monotonic()
    channel.basic_publish("later", "job.a", b"arg-during", delayed(150))
    channel.basic_publish("pol-later", "k", b"pol-during", delayed(200))
    channel.basic_publish("later", "job.b", b"arg-after", delayed(1200))
    channel.basic_publish("pol-later", "k", b"pol-after", delayed(1400))
    channel.basic_publish("later", "job.c", b"transient", delayed(150, persistent=False))
    conn.close()
    broker.stop()
    time.sleep(max(0.0, 0.25 - (time.monotonic() - start)))
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        channel = conn.channel()
        got = collect(channel, "due", 4)
        assert [body for _, body, _ in got] == [
            b"arg-during",
            b"pol-during",
            b"arg-after",
            b"pol-after",
        ]
        assert got[2][0] - start >= 1.2 and got[3][0] - start >= 1.4
        assert all("x-delay" not in headers for _, _, headers in got)
        time.sleep(0.05)
        assert channel.basic_get("due")[0] is None
        # The policy came back with the definitions: the exchange still delays.
        start = time.monotonic()
        channel.basic_publish("pol-later", "k", b"again", delayed(100))
        got = collect(channel, "due", 1)
        assert got[0][0] - start >= 0.1
        conn.close()


def test_plugin_rewrites_x_delay_on_delivery(broker: RunningBroker) -> None:
    """RabbitMQ's plugin sets `x-delay` to `-delay` (signedint) on the messages it held
    (so they are not held again), and reads integers, integer strings and truncated
    floats up to 2^32 - 1; other values, and 0 or less, route at once, untouched."""
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.exchange_declare("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    channel.queue_declare("due")
    channel.queue_bind("due", "later", "k")
    start = time.monotonic()
    channel.basic_publish("later", "k", b"int", delayed(120))
    channel.basic_publish("later", "k", b"str", delayed("140"))
    channel.basic_publish("later", "k", b"float", delayed(Decimal("160.9")))
    for delay in (0, -5, 2**32, True, "soon"):
        channel.basic_publish("later", "k", repr(delay).encode(), delayed(delay))
    got = collect(channel, "due", 8)
    at_once = got[:5]
    assert [body for _, body, _ in at_once] == [b"0", b"-5", b"4294967296", b"True", b"'soon'"]
    assert [headers["x-delay"] for _, _, headers in at_once] == [0, -5, 2**32, True, "soon"]
    assert [(body, headers["x-delay"]) for _, body, headers in got[5:]] == [
        (b"int", -120),
        (b"str", -140),
        (b"float", -160),
    ]
    assert got[7][0] - start >= 0.16
    conn.close()
