"""Dead-lettering of messages published with CC, with pika, as RabbitMQ 3.10 does it
(checked against one): x-death `routing-keys` holds the routing key and the CC keys;
without a dead-letter routing key the copy is routed with all of them and keeps its CC
header; with one it is routed with that key only and loses CC. A repeated death in the
same queue for the same reason raises the count and keeps the first death's fields."""

from __future__ import annotations

import time

import pika
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker
from tests.integration.test_ttl_dlx import connect, wait_for

TIMEOUT_S = 10


def declare(channel: BlockingChannel, dead_letter_routing_key: str | None) -> None:
    """px routes k1 to pa and k2 to pb, both expiring at once into pdlx, which routes
    k1, k2 and r to da, db and dr."""
    channel.exchange_declare("px", "direct")
    channel.exchange_declare("pdlx", "direct")
    arguments: dict[str, object] = {"x-message-ttl": 0, "x-dead-letter-exchange": "pdlx"}
    if dead_letter_routing_key is not None:
        arguments["x-dead-letter-routing-key"] = dead_letter_routing_key
    for queue, key in (("pa", "k1"), ("pb", "k2")):
        channel.queue_declare(queue, arguments=arguments)
        channel.queue_bind(queue, "px", key)
    for queue, key in (("da", "k1"), ("db", "k2"), ("dr", "r")):
        channel.queue_declare(queue)
        channel.queue_bind(queue, "pdlx", key)


def depth(channel: BlockingChannel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def test_cc_keys_are_in_x_death_and_route_the_dead_letter(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    declare(channel, None)
    channel.basic_publish(
        "px", "k1", b"m", pika.BasicProperties(headers={"CC": ["k2"], "BCC": ["r"]})
    )
    # pa and pb each dead-letter a copy, routed with k1 and k2: both reach da and db.
    for queue in ("da", "db"):
        got = wait_for(channel, queue, 2)
        deaths = sorted(
            (p.headers["x-death"][0]["queue"], p.headers["x-death"][0]["routing-keys"])  # type: ignore[attr-defined]
            for p, _ in got
        )
        assert deaths == [("pa", ["k1", "k2"]), ("pb", ["k1", "k2"])]
        assert all(p.headers["CC"] == ["k2"] for p, _ in got)  # type: ignore[attr-defined]
        assert all("BCC" not in p.headers for p, _ in got)  # type: ignore[attr-defined]
    assert depth(channel, "dr") == 0  # BCC keys are not kept for dead-lettering
    conn.close()


def test_a_dead_letter_routing_key_replaces_the_cc_keys(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    declare(channel, "r")
    channel.basic_publish("px", "k1", b"m", pika.BasicProperties(headers={"CC": ["k2"]}))
    got = wait_for(channel, "dr", 2)
    for properties, _ in got:
        headers = properties.headers  # type: ignore[attr-defined]
        assert "CC" not in headers
        assert headers["x-death"][0]["routing-keys"] == ["k1", "k2"]
    assert (depth(channel, "da"), depth(channel, "db")) == (0, 0)
    conn.close()


def test_a_repeated_death_keeps_its_first_fields(broker: RunningBroker) -> None:
    """r1 and r2 dead-letter to each other; rejecting in r1, r2, r1 gives r1's entry a
    count of 2 with the time, routing keys and original expiration of its first death."""
    conn = connect(broker)
    channel = conn.channel()
    for queue, other in (("r1", "r2"), ("r2", "r1")):
        channel.queue_declare(
            queue,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": other},
        )
    channel.basic_publish(
        "", "r1", b"m", pika.BasicProperties(headers={"CC": ["zz"]}, expiration="100000")
    )
    first_time = None
    for queue in ("r1", "r2", "r1"):
        deadline = time.monotonic() + TIMEOUT_S
        while (got := channel.basic_get(queue))[0] is None:
            assert time.monotonic() < deadline, f"nothing in {queue}"
            channel.connection.process_data_events(time_limit=0.05)
        method, properties, _ = got
        if queue == "r2":
            first_time = properties.headers["x-death"][0]["time"]
            time.sleep(1.0)  # x-death times are in seconds: let the next one differ
        channel.basic_reject(method.delivery_tag, requeue=False)
    [(properties, _)] = wait_for(channel, "r2", 1)
    headers = properties.headers  # type: ignore[attr-defined]
    r1, r2 = headers["x-death"]
    assert (r1["queue"], r1["count"], r1["routing-keys"]) == ("r1", 2, ["r1", "zz"])
    assert (r1["time"], r1["original-expiration"]) == (first_time, "100000")
    assert (r2["queue"], r2["count"], r2["routing-keys"]) == ("r2", 1, ["r2"])
    assert "CC" not in headers
    assert properties.expiration is None  # type: ignore[attr-defined]
    assert headers["x-first-death-queue"] == "r1"
    conn.close()


def test_a_batch_of_expired_messages_keeps_each_ones_routing(broker: RunningBroker) -> None:
    """Expired messages are dead-lettered in batches, and a run of identical ones shares
    one x-death splice and one route: a CC message in the middle must still go to both
    da and db, and the plain ones around it to da only, each with its own body."""
    conn = connect(broker)
    channel = conn.channel()
    declare(channel, None)
    channel.queue_unbind("pb", "px", "k2")  # only pa expires messages: one batch, in order
    for n in range(7):
        headers = {"CC": ["k2"]} if n == 3 else None
        channel.basic_publish("px", "k1", str(n).encode(), pika.BasicProperties(headers=headers))
    got = wait_for(channel, "da", 7)
    assert [body for _, body in got] == [str(n).encode() for n in range(7)]
    assert [p.headers["x-death"][0]["routing-keys"] for p, _ in got] == [  # type: ignore[attr-defined]
        ["k1"],
        ["k1"],
        ["k1"],
        ["k1", "k2"],
        ["k1"],
        ["k1"],
        ["k1"],
    ]
    [(_, body)] = wait_for(channel, "db", 1)
    assert body == b"3"
    assert depth(channel, "db") == 0
    conn.close()
