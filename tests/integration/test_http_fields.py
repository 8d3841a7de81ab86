"""Management API fields and query parameters that are kept and have their effect, or are
refused with a 400: vhost `description`, `tags`, `default_queue_type` (kept across a
restart, in GET and in definitions export and import; the type given to queues declared
without `x-queue-type`), `tracing: true` refused, exchanges' `user_who_performed_action`,
`disable_stats`/`enable_queue_totals`, the refused range queries (`lengths_age`...) and
vhost/user limits in a definitions import. One broker for the module, restarted once.

Each test fails if its field were accepted and ignored. The fields tested elsewhere are
named in docs/compatibility.md ("HTTP fields and config keys").
"""

from __future__ import annotations

import base64
import http.client
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10


class Broker:
    """A broker that a test may restart on the same data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.running = RunningBroker(data_dir)

    def restart(self) -> None:
        self.running.stop()
        self.running = RunningBroker(self.data_dir)

    def call(self, method: str, path: str, body: object = None) -> tuple[int, object]:
        status, parsed, _ = self.running.http(method, path, body)
        return status, parsed

    def channel_of(self, vhost: str) -> tuple[pika.BlockingConnection, object]:
        params = pika.ConnectionParameters(
            "127.0.0.1",
            self.running.amqp_port,
            vhost,
            pika.PlainCredentials("guest", "guest"),
            blocked_connection_timeout=TIMEOUT_S,
            socket_timeout=TIMEOUT_S,
        )
        connection = pika.BlockingConnection(params)
        return connection, connection.channel()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    running = Broker(tmp_path_factory.mktemp("fields") / "data")
    yield running
    running.running.stop()


def _get(broker: Broker, path: str) -> dict[str, object]:
    status, body = broker.call("GET", path)
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def test_vhost_description_and_tags_are_kept_shown_and_exported(broker: Broker) -> None:
    body = {"description": "team a", "tags": "eu,prod", "default_queue_type": "quorum"}
    assert broker.call("PUT", "/api/vhosts/meta", body)[0] == 201
    shown = _get(broker, "/api/vhosts/meta")
    assert (shown["description"], shown["tags"]) == ("team a", ["eu", "prod"])
    assert shown["default_queue_type"] == "quorum"
    assert shown["metadata"] == {
        "description": "team a",
        "tags": ["eu", "prod"],
        "default_queue_type": "quorum",
    }
    # A PUT on an existing vhost replaces description and tags, keeps the queue type
    # (RabbitMQ 3.10's rabbit_vhost:update/4).
    again = {"description": "team b", "tags": ["eu"], "default_queue_type": "stream"}
    assert broker.call("PUT", "/api/vhosts/meta", again)[0] == 204
    broker.restart()
    shown = _get(broker, "/api/vhosts/meta")
    assert (shown["description"], shown["tags"]) == ("team b", ["eu"])
    assert shown["default_queue_type"] == "quorum"
    listed = broker.call("GET", "/api/vhosts")[1]
    assert isinstance(listed, list)
    assert {"name": "meta", "description": "team b"}.items() <= next(
        v for v in listed if v["name"] == "meta"
    ).items()
    exported = _get(broker, "/api/definitions")
    entry = next(v for v in exported["vhosts"] if v["name"] == "meta")  # type: ignore[attr-defined]
    assert entry["metadata"] == {
        "description": "team b",
        "tags": ["eu"],
        "default_queue_type": "quorum",
    }
    assert next(v for v in exported["vhosts"] if v["name"] == "/") == {"name": "/"}  # type: ignore[attr-defined]


def test_definitions_import_keeps_vhost_metadata(broker: Broker) -> None:
    # As RabbitMQ 3.10 exports it with rabbitmqctl: under "metadata".
    document = {
        "vhosts": [
            {
                "name": "imported",
                "limits": [],
                "metadata": {
                    "description": "from rmq",
                    "tags": ["x"],
                    "default_queue_type": "stream",
                },
            }
        ]
    }
    assert broker.call("POST", "/api/definitions", document)[0] == 204
    shown = _get(broker, "/api/vhosts/imported")
    assert (shown["description"], shown["tags"], shown["default_queue_type"]) == (
        "from rmq",
        ["x"],
        "stream",
    )


def _queue_type(broker: Broker, vhost: str, name: str) -> object:
    """The queue's `x-queue-type` argument (None: none, a classic queue)."""
    arguments = _get(broker, f"/api/queues/{vhost}/{name}")["arguments"]
    assert isinstance(arguments, dict)
    return arguments.get("x-queue-type")


def test_default_queue_type_applies_to_queues_declared_without_a_type(broker: Broker) -> None:
    assert broker.call("PUT", "/api/vhosts/q", {"default_queue_type": "quorum"})[0] == 201
    connection, channel = broker.channel_of("q")
    try:
        channel.queue_declare("typed-by-vhost", durable=True)  # type: ignore[attr-defined]
        channel.queue_declare("said-classic", durable=True, arguments={"x-queue-type": "classic"})  # type: ignore[attr-defined]
        # A quorum queue cannot be exclusive: this one stays classic, as in RabbitMQ.
        exclusive = channel.queue_declare("", exclusive=True).method.queue  # type: ignore[attr-defined]
        queues = {
            name: _queue_type(broker, "q", name)
            for name in ("typed-by-vhost", "said-classic", exclusive)
        }
    finally:
        connection.close()
    assert queues == {"typed-by-vhost": "quorum", "said-classic": "classic", exclusive: None}
    # Over HTTP too.
    assert broker.call("PUT", "/api/queues/q/by-http", {"durable": True})[0] == 201
    assert _queue_type(broker, "q", "by-http") == "quorum"
    # A quorum queue refuses what RabbitMQ's quorum queues refuse.
    connection, channel = broker.channel_of("q")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="x-max-priority"):
        channel.queue_declare("prioritised", durable=True, arguments={"x-max-priority": 5})  # type: ignore[attr-defined]
    connection.close()


@pytest.mark.parametrize(
    "body",
    [{"tracing": True}, {"tracing": "true"}, {"default_queue_type": "lazy"}, {"tags": 3}],
)
def test_vhost_fields_streamq_cannot_honour_are_refused(broker: Broker, body: object) -> None:
    status, answer = broker.call("PUT", "/api/vhosts/refused", body)
    assert status == 400, answer
    assert broker.call("GET", "/api/vhosts/refused")[0] == 404


def test_tracing_false_is_accepted(broker: Broker) -> None:
    assert broker.call("PUT", "/api/vhosts/untraced", {"tracing": False})[0] == 201
    assert _get(broker, "/api/vhosts/untraced")["tracing"] is False


@pytest.mark.parametrize(
    "document",
    [
        {"vhosts": [{"name": "limited", "limits": {"max-queues": 1}}]},
        {"vhosts": [{"name": "traced", "tracing": True}]},
        {"users": [{"name": "u", "password_hash": "", "tags": [], "limits": {"max-chans": 2}}]},
    ],
)
def test_definitions_limits_and_tracing_are_refused(broker: Broker, document: object) -> None:
    status, answer = broker.call("POST", "/api/definitions", document)
    assert status == 400, answer
    assert broker.call("GET", "/api/vhosts/limited")[0] == 404
    assert broker.call("GET", "/api/users/u")[0] == 404


@pytest.mark.parametrize(
    ("parameter", "reason"),
    [
        (
            {"component": "vhost-limits", "name": "limits", "value": {"max-connections": "1"}},
            "max-connections should be a number, actually was <<",
        ),
        ({"component": "mqtt-retained", "name": "x", "value": {}}, "not found"),
    ],
)
def test_definitions_parameters_streamq_cannot_honour_are_refused(
    broker: Broker, parameter: dict[str, object], reason: str
) -> None:
    document = {
        "vhosts": [{"name": "with-limits"}],
        "parameters": [{**parameter, "vhost": "with-limits"}],
    }
    status, answer = broker.call("POST", "/api/definitions", document)
    assert status == 400 and reason in str(answer), answer
    assert broker.call("GET", "/api/vhosts/with-limits")[0] == 404  # nothing was applied


def test_exchange_user_who_performed_action(broker: Broker) -> None:
    assert broker.call("PUT", "/api/users/ops", {"password": "pw", "tags": "administrator"})[0]
    full = {"configure": ".*", "write": ".*", "read": ".*"}
    assert broker.call("PUT", "/api/permissions/%2F/ops", full)[0] == 201
    status, _, _ = broker.running.http(
        "PUT",
        "/api/exchanges/%2F/by-ops",
        {"type": "fanout", "durable": True},
        user="ops",
        password="pw",
    )
    assert status == 201
    connection, channel = broker.channel_of("/")
    try:
        channel.exchange_declare("by-guest", "direct", durable=True)  # type: ignore[attr-defined]
    finally:
        connection.close()
    broker.restart()
    who = {
        name: _get(broker, f"/api/exchanges/%2F/{name}")["user_who_performed_action"]
        for name in ("by-ops", "by-guest", "amq.topic")
    }
    assert who == {"by-ops": "ops", "by-guest": "guest", "amq.topic": "rmq-internal"}


def test_disable_stats_and_enable_queue_totals(broker: Broker) -> None:
    connection, channel = broker.channel_of("/")
    try:
        channel.queue_declare("counted")  # type: ignore[attr-defined]
        channel.basic_publish("", "counted", b"x")  # type: ignore[attr-defined]
        _get(broker, "/api/queues/%2F/counted")  # the publish is in once GET sees it
    finally:
        connection.close()

    def counted(query: str) -> dict[str, object]:
        status, listed = broker.call("GET", f"/api/queues/%2F{query}")
        assert status == 200 and isinstance(listed, list)
        return next(q for q in listed if q["name"] == "counted")

    assert {"messages", "message_stats"} <= counted("").keys()
    bare = counted("?disable_stats=true")
    assert "message_stats" not in bare and "messages" not in bare
    assert not [k for k in bare if k.endswith("_details") and isinstance(bare[k], dict)]
    totals = counted("?disable_stats=true&enable_queue_totals=true")
    assert totals["messages"] == 1 and "message_stats" not in totals


@pytest.mark.parametrize("query", ["lengths_age=60&lengths_incr=5", "msg_rates_age=60"])
def test_range_queries_are_refused(broker: Broker, query: str) -> None:
    status, answer = broker.call("GET", f"/api/overview?{query}")
    assert status == 400
    assert isinstance(answer, dict) and "samples" in str(answer["reason"])


def test_super_stream_binding_keys_and_arguments(broker: Broker) -> None:
    body = {"binding_keys": ["eu", "us"], "arguments": {"max-age": "1h"}}
    assert broker.call("PUT", "/api/stream/super-streams/%2F/orders", body)[0] == 201
    for key in ("eu", "us"):
        arguments = _get(broker, f"/api/queues/%2F/orders-{key}")["arguments"]
        assert arguments == {"x-queue-type": "stream", "x-max-age": "1h"}
    status, bindings = broker.call("GET", "/api/exchanges/%2F/orders/bindings/source")
    assert status == 200 and isinstance(bindings, list)
    assert sorted((b["routing_key"], b["destination"]) for b in bindings) == [
        ("eu", "orders-eu"),
        ("us", "orders-us"),
    ]


def _read_bytes(broker: Broker, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", broker.running.http_port, timeout=TIMEOUT_S)
    token = base64.b64encode(b"guest:guest").decode()
    try:
        conn.request("GET", path, headers={"Authorization": f"Basic {token}"})
        response = conn.getresponse()
        assert response.status == 200
        return response.read()
    finally:
        conn.close()


def test_stream_files_position_and_length(broker: Broker) -> None:
    connection, channel = broker.channel_of("/")
    try:
        channel.confirm_delivery()  # type: ignore[attr-defined]
        arguments = {"x-queue-type": "stream"}
        channel.queue_declare("filed", durable=True, arguments=arguments)  # type: ignore[attr-defined]
        channel.basic_publish("", "filed", b"y" * 100)  # type: ignore[attr-defined]
    finally:
        connection.close()
    files = _get(broker, "/api/stream-files/%2F/filed")["files"]
    assert isinstance(files, dict)
    name = max(files, key=lambda n: files[n])
    whole = _read_bytes(broker, f"/api/stream-files/%2F/filed/{name}")
    assert len(whole) == files[name] > 10
    part = _read_bytes(broker, f"/api/stream-files/%2F/filed/{name}?position=3&length=7")
    assert part == whole[3:10]
