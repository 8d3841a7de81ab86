"""Length limits on classic queues with pika: x-max-length and x-max-length-bytes, by
argument and by policy, with each x-overflow mode: drop-head (dead-lettered, reason
maxlen), reject-publish (nacked under confirms) and reject-publish-dlx."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker, dead_letter_setup, drain_bodies


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def setup(channel: BlockingChannel, **arguments: object) -> None:
    dead_letter_setup(channel, "limited", **{"x-dead-letter-exchange": "dlx", **arguments})


@pytest.mark.parametrize(
    "limit", [{"x-max-length": 3}, {"x-max-length-bytes": 3 * 4}], ids=["messages", "bytes"]
)
def test_drop_head_dead_letters_the_oldest(broker: RunningBroker, limit: dict) -> None:
    conn = connect(broker)
    channel = conn.channel()
    setup(channel, **limit)
    for n in range(5):
        channel.basic_publish("", "limited", f"m{n:03d}".encode())  # 4 bytes each
    assert drain_bodies(channel, "limited") == [b"m002", b"m003", b"m004"]
    dead = []
    while (message := channel.basic_get("dead", auto_ack=True))[0] is not None:
        dead.append((message[2], message[1].headers["x-death"][0]["reason"]))
    assert dead == [(b"m000", "maxlen"), (b"m001", "maxlen")]
    conn.close()


def test_reject_publish_nacks_under_confirms(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    setup(channel, **{"x-max-length": 2, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    channel.basic_publish("", "limited", b"a")
    channel.basic_publish("", "limited", b"b")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "limited", b"c")
    assert drain_bodies(channel, "limited") == [b"a", b"b"]
    channel.basic_publish("", "limited", b"d")  # room again: acked
    assert drain_bodies(channel, "limited") == [b"d"]
    assert drain_bodies(channel, "dead") == []  # reject-publish does not dead-letter
    conn.close()


def test_reject_publish_dlx_dead_letters_the_refused_message(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    setup(channel, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    channel.confirm_delivery()
    channel.basic_publish("", "limited", b"kept")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "limited", b"refused")
    assert drain_bodies(channel, "limited") == [b"kept"]
    assert drain_bodies(channel, "dead") == [b"refused"]
    conn.close()


def test_a_policy_sets_the_limit(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    setup(channel)
    policy = {"pattern": "^limited$", "definition": {"max-length": 2}, "apply-to": "queues"}
    assert broker.put_policy("cap", policy) == 201
    for n in range(4):
        channel.basic_publish("", "limited", str(n).encode())
    assert drain_bodies(channel, "limited") == [b"2", b"3"]
    conn.close()


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"x-overflow": "drop-tail"}, "invalid arg 'x-overflow'"),
        ({"x-max-length": -1}, "invalid arg 'x-max-length'"),
        ({"x-message-ttl": "soon"}, "invalid arg 'x-message-ttl'"),
    ],
)
def test_bad_limit_arguments_are_406(broker: RunningBroker, arguments: dict, text: str) -> None:
    conn = connect(broker)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_declare("bad", arguments=arguments)
    assert closed.value.reply_code == 406 and text in closed.value.reply_text
    conn.close()
