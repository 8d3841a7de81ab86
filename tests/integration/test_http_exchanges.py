"""`/api/exchanges` and `/api/bindings` on a real broker: declare, list, delete, publish
(routed or not, string or base64 payloads, properties seen by a pika consumer), bindings
between exchanges and queues by properties_key, bad input and refused permissions."""

from __future__ import annotations

import pika

from tests.integration.conftest import RunningBroker
from tests.integration.mgmt_http import call, connect, mgmt_broker

__all__ = ["mgmt_broker"]


def test_declare_list_get_delete(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    body = {"type": "topic", "durable": True, "auto_delete": False, "internal": False}
    assert call(b, "PUT", "/api/exchanges/%2F/x", body)[0] == 201
    assert call(b, "PUT", "/api/exchanges/%2F/x", body)[0] == 204
    status, got, _ = call(b, "PUT", "/api/exchanges/%2F/x", {"type": "fanout"})
    assert status == 400 and "inequivalent" in got["reason"]
    names = [e["name"] for e in call(b, "GET", "/api/exchanges")[1]]
    assert "" in names and "amq.topic" in names and "x" in names
    exchange = call(b, "GET", "/api/exchanges/%2F/x")[1]
    assert exchange["type"] == "topic" and exchange["durable"] is True and exchange["vhost"] == "/"
    assert call(b, "GET", "/api/exchanges/%2F/amq.default")[1]["name"] == ""
    assert len(call(b, "GET", "/api/exchanges/%2F")[1]) == len(names)
    assert call(b, "DELETE", "/api/exchanges/%2F/x")[0] == 204
    assert call(b, "GET", "/api/exchanges/%2F/x")[0] == 404
    assert call(b, "DELETE", "/api/exchanges/%2F/x")[0] == 404


def test_bad_input_and_permissions(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    assert call(b, "PUT", "/api/exchanges/%2F/x", {"type": 5})[0] == 400
    assert call(b, "PUT", "/api/exchanges/%2F/x", {"type": "nonsense"})[0] in (400, 503)
    assert call(b, "PUT", "/api/exchanges/%2F/x", {"type": "direct", "durable": 1})[0] == 400
    assert call(b, "PUT", "/api/exchanges/%2F/amq.x", {"type": "direct"})[0] == 403
    assert call(b, "DELETE", "/api/exchanges/%2F/amq.direct")[0] == 403
    assert call(b, "PUT", "/api/exchanges/%2F/y", {"type": "direct"}, user="readonly")[0] == 403
    assert call(b, "PUT", "/api/exchanges/%2F/y", {"type": "direct"}, user="mgr")[0] == 201
    assert call(b, "DELETE", "/api/exchanges/%2F/y", user="readonly")[0] == 403
    assert call(b, "GET", "/api/exchanges/%2F/y", user="stranger")[0] == 403
    assert call(b, "GET", "/api/exchanges", user="stranger")[1] == []
    body = {"routing_key": "k", "payload": "x", "payload_encoding": "string", "properties": {}}
    assert call(b, "POST", "/api/exchanges/%2F/y/publish", body, user="readonly")[0] == 403
    # RabbitMQ's 400, its channel's 404 in the reason.
    status, error, _ = call(b, "POST", "/api/exchanges/%2F/missing/publish", body)
    assert (status, error["reason"]) == (400, "404 NOT_FOUND - no exchange 'missing' in vhost '/'")


def test_absent_fields_take_the_declare_methods_defaults(mgmt_broker: RunningBroker) -> None:
    """As RabbitMQ, which fills exchange.declare and queue.declare from the body: a
    direct exchange, nothing durable."""
    b = mgmt_broker
    assert call(b, "PUT", "/api/exchanges/%2F/plain", {})[0] == 201
    exchange = call(b, "GET", "/api/exchanges/%2F/plain")[1]
    assert (exchange["type"], exchange["durable"]) == ("direct", False)
    assert call(b, "PUT", "/api/queues/%2F/plain", {})[0] == 201
    assert call(b, "GET", "/api/queues/%2F/plain")[1]["durable"] is False
    assert call(b, "PUT", "/api/exchanges/%2F/amq.direct", {"type": "direct"})[0] == 400


def test_publish(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    with connect(b) as conn:
        channel = conn.channel()
        channel.queue_declare("in")
        body = {
            "routing_key": "in",
            "payload": "hello",
            "payload_encoding": "string",
            "properties": {"delivery_mode": 2, "headers": {"h": "v"}, "content_type": "t/p"},
        }
        status, got, _ = call(b, "POST", "/api/exchanges/%2F/amq.default/publish", body)
        assert status == 200 and got == {"routed": True}
        body.update(payload="AAE=", payload_encoding="base64", properties={})
        assert call(b, "POST", "/api/exchanges/%2F/amq.default/publish", body)[1]["routed"]
        body["routing_key"] = "nowhere"
        assert call(b, "POST", "/api/exchanges/%2F/amq.default/publish", body)[1] == {
            "routed": False
        }
        _, properties, payload = channel.basic_get("in", auto_ack=True)
        assert payload == b"hello" and properties.headers == {"h": "v"}
        assert properties.delivery_mode == 2 and properties.content_type == "t/p"
        assert channel.basic_get("in", auto_ack=True)[2] == b"\x00\x01"
    stats = call(b, "GET", "/api/exchanges/%2F/amq.default")[1]["message_stats"]
    assert stats["publish_in"] == 3 and stats["publish_out"] == 2
    for bad in (
        {"payload": "x", "payload_encoding": "string"},
        {"routing_key": "in", "payload_encoding": "string", "payload": 1},
        {"routing_key": "in", "payload": "x", "payload_encoding": "hex"},
        {"routing_key": "in", "payload": "!!", "payload_encoding": "base64"},
        {
            "routing_key": "in",
            "payload": "x",
            "payload_encoding": "string",
            "properties": {"delivery_mode": "2"},
        },
        {
            "routing_key": "in",
            "payload": "x",
            "payload_encoding": "string",
            "properties": {"colour": "red"},
        },
    ):
        assert call(b, "POST", "/api/exchanges/%2F/amq.default/publish", bad)[0] == 400, bad


def test_bindings(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    call(b, "PUT", "/api/queues/%2F/q", {})
    call(b, "PUT", "/api/exchanges/%2F/x", {"type": "direct"})
    path = "/api/bindings/%2F/e/x/q/q"
    status, _, response = call(b, "POST", path, {"routing_key": "rk", "arguments": {}})
    # RabbitMQ's Location is relative to the request's path.
    assert status == 201 and response.getheader("Location") == "q/rk"
    status, _, response = call(b, "POST", path, {"routing_key": "a", "arguments": {"k": 1}})
    with_args = response.getheader("Location").rsplit("/", 1)[1]
    assert with_args.startswith("a~")
    listed = call(b, "GET", path)[1]
    assert [(x["routing_key"], x["properties_key"]) for x in listed] == [
        ("a", with_args),
        ("rk", "rk"),
    ]
    one = call(b, "GET", f"{path}/rk")[1]
    assert one["source"] == "x" and one["destination"] == "q" and one["destination_type"] == "queue"
    assert call(b, "GET", f"{path}/nope")[0] == 404
    all_bindings = call(b, "GET", "/api/bindings/%2F")[1]
    assert ("", "q") in [(x["source"], x["destination"]) for x in all_bindings]
    assert len(call(b, "GET", "/api/bindings")[1]) == len(all_bindings)
    source = call(b, "GET", "/api/exchanges/%2F/x/bindings/source")[1]
    assert len(source) == 2
    # The binding routes.
    body = {"routing_key": "rk", "payload": "x", "payload_encoding": "string", "properties": {}}
    assert call(b, "POST", "/api/exchanges/%2F/x/publish", body)[1] == {"routed": True}
    assert call(b, "DELETE", f"{path}/rk")[0] == 204
    assert call(b, "DELETE", f"{path}/{with_args}")[0] == 204
    assert call(b, "GET", path)[1] == []
    assert call(b, "POST", "/api/exchanges/%2F/x/publish", body)[1] == {"routed": False}


def test_a_binding_key_is_quoted_as_rabbitmq_quotes_it(mgmt_broker: RunningBroker) -> None:
    """RabbitMQ's properties_key quotes the routing key with quote_plus and escapes "~";
    its Location quotes that once more; a client quotes it into the path to delete."""
    b = mgmt_broker
    call(b, "PUT", "/api/queues/%2F/q", {})
    path = "/api/bindings/%2F/e/amq.direct/q/q"
    status, _, response = call(b, "POST", path, {"routing_key": "a/b c~d"})
    assert status == 201 and response.getheader("Location") == "q/a%252Fb%2Bc%257Ed"
    listed = call(b, "GET", path)[1]
    assert [x["properties_key"] for x in listed] == ["a%2Fb+c%7Ed"]
    assert call(b, "DELETE", f"{path}/a%252Fb%2Bc%257Ed")[0] == 204


def test_exchange_to_exchange_bindings(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    call(b, "PUT", "/api/exchanges/%2F/src", {"type": "fanout"})
    call(b, "PUT", "/api/exchanges/%2F/dst", {"type": "fanout"})
    path = "/api/bindings/%2F/e/src/e/dst"
    status, _, response = call(b, "POST", path, {})
    assert status == 201 and response.getheader("Location") == "dst/~"
    assert call(b, "GET", f"{path}/~")[1]["destination_type"] == "exchange"
    destination = call(b, "GET", "/api/exchanges/%2F/dst/bindings/destination")[1]
    assert [x["source"] for x in destination] == ["src"]
    assert call(b, "DELETE", f"{path}/~")[0] == 204


def test_binding_bad_input_and_permissions(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    call(b, "PUT", "/api/queues/%2F/q", {})
    path = "/api/bindings/%2F/e/amq.direct/q/q"
    assert call(b, "POST", path, {"routing_key": 5})[0] == 400
    assert call(b, "POST", path, {"arguments": "no"})[0] == 400
    assert call(b, "POST", "/api/bindings/%2F/e/missing/q/q", {})[0] == 404
    assert call(b, "POST", "/api/bindings/%2F/e/amq.direct/q/missing", {})[0] == 404
    assert call(b, "POST", "/api/bindings/%2F/e/amq.default/q/q", {})[0] == 403
    assert call(b, "POST", path, {"routing_key": "k"}, user="readonly")[0] == 403
    assert call(b, "POST", path, {"routing_key": "k"}, user="mgr")[0] == 201
    assert call(b, "DELETE", f"{path}/k", user="readonly")[0] == 403
    assert call(b, "GET", path, user="stranger")[0] == 403
    with connect(b) as conn:  # the binding routes for AMQP publishers too
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("amq.direct", "k", b"m", mandatory=True)
        assert channel.basic_get("q", auto_ack=True)[2] == b"m"
        try:
            channel.basic_publish("amq.direct", "none", b"m", mandatory=True)
            raise AssertionError("not returned")
        except pika.exceptions.UnroutableError:
            pass
