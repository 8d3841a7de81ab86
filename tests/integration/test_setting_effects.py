"""Settings whose effect no other test proved: each test here fails if the broker took
the setting and ignored it (docs/compatibility.md, "Accepted settings and the test that
proves each").

Operator policies cap a queue's limits whatever its arguments and policy say (each of
their five keys); policy keys of classic queues that other tests set only as arguments:
`max-length-bytes` with `overflow`, `dead-letter-routing-key`. Driven with pika.
"""

from __future__ import annotations

import time

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker, drain_bodies

TIMEOUT_S = 10.0
POLL_S = 0.05


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def operator_policy(broker: RunningBroker, definition: dict[str, object]) -> None:
    body = {"pattern": "^capped$", "apply-to": "queues", "definition": definition}
    status = broker.http("PUT", "/api/operator-policies/%2F/cap", body)[0]
    assert status == 201


def wait_for_bodies(channel: BlockingChannel, queue: str, count: int) -> list[bytes]:
    """basic.get until `count` messages came, within TIMEOUT_S."""
    got: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {got} of {count} in {queue}"
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            channel.connection.process_data_events(time_limit=POLL_S)
            continue
        got.append(body)
    return got


def test_operator_max_length_caps_a_larger_argument(broker: RunningBroker) -> None:
    operator_policy(broker, {"max-length": 2})
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("capped", arguments={"x-max-length": 10})
    for n in range(4):
        channel.basic_publish("", "capped", str(n).encode())
    assert drain_bodies(channel, "capped") == [b"2", b"3"]
    conn.close()


def test_operator_max_length_bytes_caps_a_policy(broker: RunningBroker) -> None:
    policy = {"pattern": "^capped$", "definition": {"max-length-bytes": 100}}
    assert broker.put_policy("loose", policy) == 201
    operator_policy(broker, {"max-length-bytes": 5})
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("capped")
    for body in (b"aaa", b"bbb", b"ccc"):
        channel.basic_publish("", "capped", body)
    assert drain_bodies(channel, "capped") == [b"ccc"]
    conn.close()


def test_operator_message_ttl_expires_messages(broker: RunningBroker) -> None:
    operator_policy(broker, {"message-ttl": 50})
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("dead")
    dead = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    channel.queue_declare("capped", arguments={**dead, "x-message-ttl": 60_000})
    channel.basic_publish("", "capped", b"short-lived")
    assert wait_for_bodies(channel, "dead", 1) == [b"short-lived"]
    assert drain_bodies(channel, "capped") == []
    conn.close()


def test_operator_expires_deletes_an_unused_queue(broker: RunningBroker) -> None:
    operator_policy(broker, {"expires": 200})
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("capped")
    probe = conn.channel()
    probe.confirm_delivery()
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            probe.basic_publish("", "capped", b"probe", mandatory=True)
        except pika.exceptions.UnroutableError:
            break  # gone: a mandatory publish comes back
        assert time.monotonic() < deadline, "the queue did not expire"
        probe.connection.process_data_events(time_limit=POLL_S)
    conn.close()


def test_operator_delivery_limit_dead_letters_a_requeued_message(broker: RunningBroker) -> None:
    operator_policy(broker, {"delivery-limit": 0})
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("dead")
    dead = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    channel.queue_declare("capped", arguments=dead)
    channel.basic_publish("", "capped", b"once")
    method, _, _ = channel.basic_get("capped")
    assert method is not None
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert wait_for_bodies(channel, "dead", 1) == [b"once"]
    assert drain_bodies(channel, "capped") == []
    conn.close()


@pytest.mark.parametrize("overflow", ["reject-publish", "drop-head"])
def test_policy_max_length_bytes_with_its_overflow(broker: RunningBroker, overflow: str) -> None:
    definition = {"max-length-bytes": 6, "overflow": overflow}
    assert broker.put_policy("bytes", {"pattern": "^limited$", "definition": definition}) == 201
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("limited")
    channel.confirm_delivery()
    channel.basic_publish("", "limited", b"aaa")
    channel.basic_publish("", "limited", b"bbb")
    if overflow == "reject-publish":
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", "limited", b"ccc")
        assert drain_bodies(channel, "limited") == [b"aaa", b"bbb"]
    else:
        channel.basic_publish("", "limited", b"ccc")
        assert drain_bodies(channel, "limited") == [b"bbb", b"ccc"]
    conn.close()


def test_policy_dead_letter_routing_key(broker: RunningBroker) -> None:
    definition = {"dead-letter-exchange": "amq.direct", "dead-letter-routing-key": "graveyard"}
    assert broker.put_policy("dlx", {"pattern": "^source$", "definition": definition}) == 201
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("graveyard")
    channel.queue_bind("graveyard", "amq.direct", "graveyard")
    channel.queue_declare("other")
    channel.queue_bind("other", "amq.direct", "source")  # the message's own key
    channel.queue_declare("source")
    channel.basic_publish("", "source", b"rejected")
    method, _, _ = channel.basic_get("source")
    assert method is not None
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert wait_for_bodies(channel, "graveyard", 1) == [b"rejected"]
    assert drain_bodies(channel, "other") == []
    conn.close()


def test_exchange_argument_x_alternate_exchange(broker: RunningBroker) -> None:
    """LavinMQ's spelling of `alternate-exchange`, which streamq takes too."""
    conn = connect(broker)
    channel = conn.channel()
    channel.exchange_declare("spare", "fanout")
    channel.queue_declare("unrouted")
    channel.queue_bind("unrouted", "spare")
    channel.exchange_declare("main", "direct", arguments={"x-alternate-exchange": "spare"})
    channel.basic_publish("main", "nobody", b"elsewhere")
    assert wait_for_bodies(channel, "unrouted", 1) == [b"elsewhere"]
    conn.close()


def first_stream_offset(conn: pika.BlockingConnection, stream: str) -> int:
    """The x-stream-offset of the first message a consumer from `first` gets."""
    channel = conn.channel()
    channel.basic_qos(prefetch_count=1)
    arguments = {"x-stream-offset": "first"}
    for method, properties, _ in channel.consume(
        stream, arguments=arguments, inactivity_timeout=TIMEOUT_S
    ):
        assert method is not None, "the stream delivered nothing"
        channel.basic_ack(method.delivery_tag)
        channel.close()
        return int(properties.headers["x-stream-offset"])
    raise AssertionError("unreachable")


SMALL_STREAM = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}


@pytest.mark.parametrize("definition", [{"max-length-bytes": 5000}, {"max-age": "1s"}])
def test_stream_retention_by_policy(broker: RunningBroker, definition: dict[str, object]) -> None:
    """4 KiB segments: 200 messages of 100 bytes fill several, and the policy's rule
    drops the old ones (for max-age, once they are older and a segment rolls)."""
    policy = {"pattern": "^kept$", "apply-to": "streams", "definition": definition}
    assert broker.put_policy("retention", policy) == 201
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("kept", durable=True, arguments=SMALL_STREAM)
    channel.confirm_delivery()
    for n in range(200):
        channel.basic_publish("", "kept", f"{n:04d}".encode() + b"." * 100)
    if "max-age" in definition:
        assert first_stream_offset(conn, "kept") == 0
        time.sleep(1.2)  # older than max-age: bounded, as the rule is about time
        for n in range(200, 240):  # rolls a segment: retention is checked again
            channel.basic_publish("", "kept", f"{n:04d}".encode() + b"." * 100)
    assert first_stream_offset(conn, "kept") > 100
    conn.close()
