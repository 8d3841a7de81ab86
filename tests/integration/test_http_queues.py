"""`/api/queues` on a real broker: declare, list, inspect (depths, consumers, message
stats and their rates), bindings, purge, get and delete, with bad input and refused
permissions answered as RabbitMQ answers them."""

from __future__ import annotations

import pika

from tests.integration.conftest import RunningBroker
from tests.integration.mgmt_http import call, connect, mgmt_broker, wait_for

__all__ = ["mgmt_broker"]


def test_declare_list_get_delete(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    body = {"durable": True, "auto_delete": False, "arguments": {"x-max-length": 10}}
    assert call(b, "PUT", "/api/queues/%2F/q1", body)[0] == 201
    assert call(b, "PUT", "/api/queues/%2F/q1", body)[0] == 204
    status, got, _ = call(b, "PUT", "/api/queues/%2F/q1", {"durable": False})
    assert status == 400 and "inequivalent arg 'durable'" in got["reason"]
    status, queues, _ = call(b, "GET", "/api/queues")
    assert status == 200 and [x["name"] for x in queues] == ["q1"]
    status, queue, _ = call(b, "GET", "/api/queues/%2F/q1")
    assert status == 200
    assert queue["vhost"] == "/" and queue["type"] == "classic" and queue["durable"] is True
    assert queue["arguments"] == {"x-max-length": 10} and queue["messages"] == 0
    assert queue["state"] == "running" and queue["consumers"] == 0
    assert call(b, "GET", "/api/queues/%2F")[1][0]["name"] == "q1"
    assert call(b, "GET", "/api/queues/%2F/missing")[0] == 404
    assert call(b, "GET", "/api/queues/nowhere")[0] == 404
    assert call(b, "DELETE", "/api/queues/%2F/q1")[0] == 204
    assert call(b, "DELETE", "/api/queues/%2F/q1")[0] == 404
    # The queue is gone for AMQP clients too.
    with connect(b) as conn:
        channel = conn.channel()
        try:
            channel.queue_declare("q1", passive=True)
            raise AssertionError("declared")
        except pika.exceptions.ChannelClosedByBroker as exc:
            assert exc.reply_code == 404


def test_bad_declarations(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    assert call(b, "PUT", "/api/queues/%2F/q", {"durable": "yes"})[0] == 400
    assert call(b, "PUT", "/api/queues/%2F/q", {"arguments": []})[0] == 400
    assert call(b, "PUT", "/api/queues/%2F/q", [1])[0] == 400
    assert call(b, "PUT", "/api/queues/%2F/amq.q", {})[0] == 403
    status, got, _ = call(b, "PUT", "/api/queues/%2F/q", {"arguments": {"x-message-ttl": -1}})
    assert status == 400 and got["reason"]


def test_permissions_and_visibility(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    assert call(b, "PUT", "/api/queues/%2F/q", {}, user="mgr")[0] == 201
    assert call(b, "PUT", "/api/queues/%2F/q2", {}, user="readonly")[0] == 403
    assert call(b, "DELETE", "/api/queues/%2F/q", user="readonly")[0] == 403
    assert call(b, "GET", "/api/queues/%2F/q", user="readonly")[0] == 200
    assert call(b, "GET", "/api/queues", user="stranger")[1] == []
    assert call(b, "GET", "/api/queues/%2F/q", user="stranger")[0] == 403
    assert [x["name"] for x in call(b, "GET", "/api/queues", user="mon")[1]] == ["q"]
    assert call(b, "DELETE", "/api/queues/%2F/q/contents", user="stranger")[0] == 403
    body = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    assert call(b, "POST", "/api/queues/%2F/q/get", body, user="stranger")[0] == 403


def test_depths_consumers_and_message_stats(mgmt_broker: RunningBroker) -> None:
    """Publish and consume with pika; the queue shows depths, its consumer, and counters
    whose rates move once the sampler (interval shortened for the test) has run."""
    b = mgmt_broker
    assert b.broker is not None
    b.broker.stats_sampler.interval_s = 0.1
    with connect(b) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.queue_declare("work")
        for index in range(20):
            channel.basic_publish("", "work", f"m{index}".encode())
        queue = call(b, "GET", "/api/queues/%2F/work")[1]
        assert queue["messages_ready"] == 20 and queue["messages"] == 20
        stats = queue["message_stats"]
        assert stats["publish"] == 20
        channel.basic_qos(prefetch_count=5)
        channel.basic_consume("work", lambda *args: None, consumer_tag="ctag")
        conn.process_data_events(time_limit=0.2)

        def unacked() -> bool:
            conn.process_data_events(time_limit=0.01)
            return call(b, "GET", "/api/queues/%2F/work")[1]["messages_unacknowledged"] == 5

        wait_for(unacked)
        queue = call(b, "GET", "/api/queues/%2F/work")[1]
        assert queue["consumers"] == 1 and queue["messages_ready"] == 15
        details = queue["consumer_details"][0]
        assert details["consumer_tag"] == "ctag" and details["prefetch_count"] == 5
        assert details["ack_required"] is True and details["queue"]["name"] == "work"
        assert details["channel_details"]["connection_name"].endswith(f":{b.amqp_port}")
        assert queue["message_stats"]["deliver"] == 5
        assert queue["message_stats"]["deliver_get"] == 5

        def rated() -> bool:
            # Rates are per sample interval: keep the messages flowing while looking.
            for _ in range(5):
                channel.basic_publish("", "work", b"more")
            channel.basic_ack(0, multiple=True)
            conn.process_data_events(time_limit=0.05)
            got = call(b, "GET", "/api/queues/%2F/work")[1]["message_stats"]
            return all(
                got.get(f"{name}_details", {"rate": 0})["rate"] > 0
                for name in ("publish", "deliver", "ack", "deliver_get")
            )

        wait_for(rated)
        overview = call(b, "GET", "/api/overview")[1]["message_stats"]
        assert overview["publish"] >= 25 and overview["confirm"] >= 25
        assert overview["deliver_get"] >= 5 and "publish_details" in overview
        vhost = call(b, "GET", "/api/queues/%2F/work")[1]["message_stats"]
        assert vhost["ack"] >= 5


def test_purge(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    with connect(b) as conn:
        channel = conn.channel()
        channel.queue_declare("p")
        channel.confirm_delivery()
        for _ in range(3):
            channel.basic_publish("", "p", b"x")
    assert call(b, "DELETE", "/api/queues/%2F/p/contents", user="readonly")[0] == 204
    assert call(b, "GET", "/api/queues/%2F/p")[1]["messages"] == 0
    assert call(b, "DELETE", "/api/queues/%2F/missing/contents")[0] == 404


def test_delete_if_empty_and_if_unused(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    with connect(b) as conn:
        channel = conn.channel()
        channel.queue_declare("full")
        channel.confirm_delivery()
        channel.basic_publish("", "full", b"x")
        channel.queue_declare("used")
        channel.basic_consume("used", lambda *args: None)
        status, got, _ = call(b, "DELETE", "/api/queues/%2F/full?if-empty=true")
        assert status == 400 and "not empty" in got["reason"]
        status, got, _ = call(b, "DELETE", "/api/queues/%2F/used?if-unused=true")
        assert status == 400 and "in use" in got["reason"]
        assert call(b, "DELETE", "/api/queues/%2F/full")[0] == 204
        # Deleting a queue with a consumer cancels it (consumer_cancel_notify).
        assert call(b, "DELETE", "/api/queues/%2F/used")[0] == 204
        wait_for(lambda: conn.process_data_events(time_limit=0.01) or not channel.consumer_tags)


def test_get_modes(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    with connect(b) as conn:
        channel = conn.channel()
        channel.queue_declare("g")
        channel.confirm_delivery()
        channel.basic_publish(
            "", "g", b"hello", pika.BasicProperties(content_type="text/plain", headers={"k": 1})
        )
        channel.basic_publish("", "g", b"\xff\xfe")
    body = {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 3}
    status, got, _ = call(b, "POST", "/api/queues/%2F/g/get", body, user="readonly")
    assert status == 200 and len(got) == 2
    first, second = got
    assert first["payload"] == "hel" and first["payload_encoding"] == "string"
    assert first["payload_bytes"] == 5 and first["redelivered"] is False
    assert first["routing_key"] == "g" and first["exchange"] == ""
    assert first["properties"]["content_type"] == "text/plain"
    assert first["properties"]["headers"] == {"k": 1}
    assert second["payload_encoding"] == "base64" and second["payload"] == "//4="
    # Requeued: still there, now redelivered.
    body = {"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64"}
    status, got, _ = call(b, "POST", "/api/queues/%2F/g/get", body)
    assert got[0]["redelivered"] is True and got[0]["payload"] == "aGVsbG8="
    assert got[0]["message_count"] == 1
    body = {"count": 1, "ackmode": "reject_requeue_false", "encoding": "auto"}
    assert len(call(b, "POST", "/api/queues/%2F/g/get", body)[1]) == 1
    assert call(b, "GET", "/api/queues/%2F/g")[1]["messages"] == 0
    assert call(b, "POST", "/api/queues/%2F/g/get", body)[1] == []
    stats = call(b, "GET", "/api/queues/%2F/g")[1]["message_stats"]
    assert stats["get"] == 4 and stats["ack"] == 1 and stats["redeliver"] == 2


def test_get_bad_input(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    call(b, "PUT", "/api/queues/%2F/g", {})
    for body in (
        {"ackmode": "ack_requeue_true", "encoding": "auto"},
        {"count": -1, "ackmode": "ack_requeue_true", "encoding": "auto"},
        {"count": 1, "ackmode": "keep", "encoding": "auto"},
        {"count": 1, "ackmode": "ack_requeue_true", "encoding": "hex"},
        {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": -1},
    ):
        assert call(b, "POST", "/api/queues/%2F/g/get", body)[0] == 400, body
    body = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    assert call(b, "POST", "/api/queues/%2F/missing/get", body)[0] == 404
    # A count of 0 takes nothing, as in RabbitMQ.
    zero = {"count": 0, "ackmode": "ack_requeue_false", "encoding": "auto"}
    assert call(b, "POST", "/api/queues/%2F/g/get", zero)[:2] == (200, [])


def test_queue_bindings_and_streams(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    body = {"durable": True, "arguments": {"x-queue-type": "stream"}}
    assert call(b, "PUT", "/api/queues/%2F/s", body)[0] == 201
    with connect(b) as conn:
        channel = conn.channel()
        channel.queue_bind("s", "amq.direct", "rk")
        channel.confirm_delivery()
        for _ in range(4):
            channel.basic_publish("amq.direct", "rk", b"x")
    stream = call(b, "GET", "/api/queues/%2F/s")[1]
    assert stream["type"] == "stream" and stream["messages"] == 4
    assert stream["first_offset"] == 0 and stream["last_offset"] == 3 and stream["segments"] == 1
    bindings = call(b, "GET", "/api/queues/%2F/s/bindings")[1]
    assert [(x["source"], x["routing_key"]) for x in bindings] == [("", "s"), ("amq.direct", "rk")]
    body = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    assert call(b, "POST", "/api/queues/%2F/s/get", body)[0] == 400
    assert call(b, "GET", "/api/queues/%2F/missing/bindings")[0] == 404
