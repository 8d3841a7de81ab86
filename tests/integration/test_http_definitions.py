"""Definitions export and import over the management API, against a RabbitMQ 3.10 export.

tests/data/rabbitmq-3.10-definitions.json was exported (GET /api/definitions) from a
RabbitMQ 3.10.8 with users of each tag, vhosts prod and staging, permissions, topic
permissions, policies, an operator policy, durable queues (classic, stream,
TTL, dead-lettering, priority), exchanges of four types and bindings to queues and
exchanges, some with arguments. Passwords: admin1/admin-secret, app1/app-secret,
hashed1/hashed-secret (set by hash), mgmt1/mgmt-secret, monitor1/monitor-secret. Its
vhost limit (a "vhost-limits" parameter) was taken out when streamq refused those; limits
in definitions are tested in tests/integration/test_limits.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.conftest import RunningBroker, broker_on

TIMEOUT_S = 10
DATA = Path(__file__).parent.parent / "data" / "rabbitmq-3.10-definitions.json"
GUEST = ("guest", "guest")


def call(
    broker: RunningBroker,
    method: str,
    path: str,
    body: object = None,
    user: tuple[str, str] = GUEST,
) -> tuple[int, object]:
    status, parsed, _ = broker.http(method, path, body, user=user[0], password=user[1])
    return status, parsed


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningBroker]:
    broker = RunningBroker(tmp_path / "data")
    yield broker
    broker.stop()


def connect(broker: RunningBroker, user: str, password: str, vhost: str) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        "127.0.0.1",
        broker.amqp_port,
        vhost,
        pika.PlainCredentials(user, password),
        blocked_connection_timeout=TIMEOUT_S,
        socket_timeout=TIMEOUT_S,
    )
    return pika.BlockingConnection(params)


def normalised(document: dict[str, object]) -> dict[str, object]:
    """The parts both brokers share, order-free: what a round trip must keep."""

    def key(entry: object) -> str:
        return json.dumps(entry, sort_keys=True)

    out: dict[str, object] = {}
    parts = ("users", "vhosts", "permissions", "topic_permissions", "policies", "queues")
    for part in (*parts, "exchanges", "bindings"):
        entries = document[part]
        assert isinstance(entries, list)
        if part == "users":
            entries = [{k: u[k] for k in ("name", "password_hash", "tags")} for u in entries]
        out[part] = sorted(entries, key=key)
    parameters = document["parameters"]
    assert isinstance(parameters, list)
    out["operator_policies"] = sorted(
        (p for p in parameters if p["component"] == "operator_policy"), key=key
    )
    return out


def import_rabbitmq(broker: RunningBroker) -> dict[str, object]:
    original = json.loads(DATA.read_text())
    status, body = call(broker, "POST", "/api/definitions", original)
    assert status == 204, body
    return original


def test_a_rabbitmq_export_imports_works_and_exports_back(running: RunningBroker) -> None:
    original = import_rabbitmq(running)
    # Idempotent: importing the same document again changes nothing.
    assert call(running, "POST", "/api/definitions", original)[0] == 204
    status, exported = call(running, "GET", "/api/definitions")
    assert status == 200
    assert isinstance(exported, dict)
    assert normalised(exported) == normalised(original)
    # Users log in over AMQP with their RabbitMQ passwords, set in clear or by hash.
    with connect(running, "app1", "app-secret", "prod") as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("", "orders", b"to orders")  # write: ^(...|amq\\.default|orders)
        method, _, body = channel.basic_get("orders", auto_ack=True)
        assert method is not None and body == b"to orders"
        # Its permissions came along: "fan" is not in its write regex.
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="403"):
            channel.basic_publish("fan", "", b"refused")
    with connect(running, "hashed1", "hashed-secret", "prod") as conn:
        assert conn.channel().queue_declare("dead", passive=True).method.message_count == 0
    # Exchange-to-exchange binding and a headers binding with arguments route.
    with connect(running, "admin1", "admin-secret", "prod") as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("events.topic", "x.1", b"via e2e")  # events.topic -> e2e -> orders
        headers = pika.BasicProperties(headers={"type": "order", "region": "eu"})
        channel.basic_publish("hdr", "", b"by headers", headers)
        assert channel.basic_get("orders", auto_ack=True)[2] == b"via e2e"
        assert channel.basic_get("work", auto_ack=True)[2] == b"by headers"


def test_imported_definitions_survive_a_restart(running: RunningBroker) -> None:
    original = import_rabbitmq(running)
    running.stop()
    with broker_on(running.data_dir) as again:
        status, exported = call(again, "GET", "/api/definitions")
        assert status == 200 and isinstance(exported, dict)
        assert normalised(exported) == normalised(original)


def test_vhost_export_and_import(running: RunningBroker) -> None:
    import_rabbitmq(running)
    status, exported = call(running, "GET", "/api/definitions/prod")
    assert status == 200 and isinstance(exported, dict)
    queues = exported["queues"]
    assert isinstance(queues, list)
    assert {q["name"] for q in queues} >= {"orders", "events", "work"}
    assert all("vhost" not in q for q in queues)
    assert call(running, "PUT", "/api/vhosts/copy")[0] == 201
    assert call(running, "POST", "/api/definitions/copy", exported)[0] == 204
    status, copied = call(running, "GET", "/api/definitions/copy")
    assert status == 200 and isinstance(copied, dict)
    # As in RabbitMQ's vhost export, parameters alone name their vhost.
    parameters = exported.pop("parameters")
    assert isinstance(parameters, list)
    assert copied.pop("parameters") == [{**p, "vhost": "copy"} for p in parameters]
    assert copied == exported


def test_bad_imports_are_400_and_missing_vhosts_404(running: RunningBroker) -> None:
    assert call(running, "POST", "/api/definitions", b"{not json")[0] == 400
    assert call(running, "POST", "/api/definitions", [])[0] == 400
    assert call(running, "POST", "/api/definitions", {"queues": [{"name": "q"}]})[0] == 400
    assert call(running, "POST", "/api/definitions", {"queues": "q"})[0] == 400
    bad_hash = {"users": [{"name": "u", "password_hash": "x", "tags": []}]}
    assert call(running, "POST", "/api/definitions", bad_hash)[0] == 400
    sha512 = {"users": [{"name": "u", "password_hash": "", "hashing_algorithm": "md5"}]}
    assert call(running, "POST", "/api/definitions", sha512)[0] == 400
    assert call(running, "GET", "/api/definitions/nope")[0] == 404
    assert call(running, "POST", "/api/definitions/nope", {})[0] == 404


def test_definitions_need_administrator(running: RunningBroker) -> None:
    import_rabbitmq(running)
    for user in (("mgmt1", "mgmt-secret"), ("monitor1", "monitor-secret")):
        assert call(running, "GET", "/api/definitions", user=user)[0] == 403
        assert call(running, "GET", "/api/definitions/staging", user=user)[0] == 403
        assert call(running, "POST", "/api/definitions", {}, user=user)[0] == 403
    assert call(running, "GET", "/api/definitions", user=("app1", "app-secret"))[0] == 401
    assert call(running, "GET", "/api/definitions", user=("admin1", "wrong"))[0] == 401
