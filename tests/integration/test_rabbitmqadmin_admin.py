"""RabbitMQ's own rabbitmqadmin against streamq's management API: users, vhosts,
permissions, policies and parameters, listing every object type in each format, closing
connections and deleting entities (the declare, publish, get and definitions commands are
in test_rabbitmqadmin.py; how the script is found and run, in rabbitmqadmin_runner.py).
"""

from __future__ import annotations

import json

import pika
import pytest

from tests.integration.conftest import RunningBroker
from tests.integration.rabbitmqadmin_runner import (
    Admin,
    admin,
    api,
    client,
    names,
    rabbitmqadmin,
    status_of,
)

__all__ = ["admin", "client", "rabbitmqadmin"]


# -- users, vhosts, permissions, policies, parameters --------------------------------------


def test_users_vhosts_and_permissions(admin: Admin, broker: RunningBroker) -> None:
    admin.ok("declare", "vhost", "name=team", "tracing=false")
    admin.ok("declare", "user", "name=alice", "password=s3cret", "tags=management,policymaker")
    admin.ok("declare", "user", "name=bob", "password=pw", "tags=")
    admin.ok(
        "declare", "permission", "vhost=team", "user=alice", "configure=^a", "write=.*", "read=.*"
    )
    assert "tracing must be true or false" in admin.fails(
        "declare", "vhost", "name=x", "tracing=on"
    )
    assert status_of(broker, "/api/vhosts/x") == 404
    user = api(broker, "/api/users/alice")
    assert isinstance(user, dict) and user["tags"] == ["management", "policymaker"]
    bob = api(broker, "/api/users/bob")
    assert isinstance(bob, dict) and bob["tags"] == []
    permission = api(broker, "/api/permissions/team/alice")
    assert isinstance(permission, dict)
    assert (permission["configure"], permission["write"], permission["read"]) == ("^a", ".*", ".*")
    # alice logs in to the new vhost over AMQP, and her configure regex is enforced.
    credentials = pika.PlainCredentials("alice", "s3cret")
    params = pika.ConnectionParameters(
        "127.0.0.1", broker.amqp_port, "team", credentials, blocked_connection_timeout=10
    )
    with pika.BlockingConnection(params) as conn:
        conn.channel().queue_declare("a-queue")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            conn.channel().queue_declare("b-queue")
    assert refused.value.reply_code == 403
    listed = admin.tsv("list", "permissions")
    assert {"user": "alice", "vhost": "team", "configure": "^a", "write": ".*", "read": ".*"} in [
        {k: row[k] for k in ("user", "vhost", "configure", "write", "read")} for row in listed
    ]
    admin.ok("delete", "permission", "vhost=team", "user=alice")
    assert status_of(broker, "/api/permissions/team/alice") == 404
    admin.ok("delete", "user", "name=alice")
    assert status_of(broker, "/api/users/alice") == 404
    admin.ok("delete", "vhost", "name=team")
    assert status_of(broker, "/api/vhosts/team") == 404
    assert "team" not in names(api(broker, "/api/vhosts"))


def test_policies_operator_policies_and_parameters(admin: Admin, broker: RunningBroker) -> None:
    admin.ok("declare", "queue", "name=capped.q")
    admin.ok(
        "declare",
        "policy",
        "name=cap",
        "pattern=^capped\\.",
        'definition={"max-length": 1}',
        "priority=3",
        "apply-to=queues",
    )
    policy = api(broker, "/api/policies/%2F/cap")
    assert isinstance(policy, dict)
    assert (policy["priority"], policy["apply-to"], policy["definition"]) == (
        3,
        "queues",
        {"max-length": 1},
    )
    queue = api(broker, "/api/queues/%2F/capped.q")
    assert isinstance(queue, dict) and queue["policy"] == "cap"
    rows = admin.tsv("list", "policies")
    assert [(r["name"], json.loads(r["definition"])) for r in rows] == [("cap", {"max-length": 1})]
    admin.ok("declare", "operator_policy", "name=ops", "pattern=.*", 'definition={"max-length": 9}')
    admin.ok(
        "declare",
        "parameter",
        "component=operator_policy",
        "name=ops2",
        'value={"pattern": "^z", "definition": {"max-length": 5}}',
    )
    assert names(api(broker, "/api/operator-policies/%2F")) == ["ops", "ops2"]
    params = admin.raw("list", "parameters")
    assert [(p["component"], p["name"]) for p in params] == [  # type: ignore[union-attr]
        ("operator_policy", "ops"),
        ("operator_policy", "ops2"),
    ]
    admin.ok(
        "declare",
        "parameter",
        "component=federation-upstream",
        "name=up",
        'value={"uri": "amqp://"}',
    )
    assert ("federation-upstream", "up") in [
        (p["component"], p["name"])
        for p in admin.raw("list", "parameters")  # type: ignore[union-attr]
    ]
    assert "component mqtt not found" in admin.fails(
        "declare", "parameter", "component=mqtt", "name=up", 'value={"x": 1}'
    )
    admin.ok("delete", "parameter", "component=federation-upstream", "name=up")
    admin.ok("delete", "parameter", "component=operator_policy", "name=ops2")
    admin.ok("delete", "operator_policy", "name=ops")
    assert api(broker, "/api/operator-policies") == []
    admin.ok("delete", "policy", "name=cap")
    assert status_of(broker, "/api/policies/%2F/cap") == 404
    queue = api(broker, "/api/queues/%2F/capped.q")
    assert isinstance(queue, dict) and queue["policy"] is None
    # Vhost limits: declared, listed, and in force on the next connection.open.
    assert admin.raw("list", "vhost_limits") == []
    admin.ok("declare", "vhost", "name=limited")
    admin.ok("declare", "vhost_limit", "vhost=limited", "name=max-connections", "value=0")
    assert admin.raw("list", "vhost_limits") == [
        {"vhost": "limited", "value": {"max-connections": 0}}
    ]
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError, match="connection limit \\(0\\)"):
        pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", broker.amqp_port, virtual_host="limited")
        )
    admin.ok("delete", "vhost_limit", "vhost=limited", "name=max-connections")
    assert admin.raw("list", "vhost_limits") == [{"vhost": "limited", "value": []}]
    admin.ok("delete", "vhost", "name=limited")


# -- listing, formats, close ---------------------------------------------------------------


def test_list_every_object_type(
    admin: Admin, broker: RunningBroker, client: pika.BlockingConnection
) -> None:
    channel = client.channel()
    channel.queue_declare("listed", durable=True)
    channel.basic_consume("listed", lambda *args: None, consumer_tag="ctag")
    client.process_data_events(time_limit=0.05)
    admin.ok("declare", "policy", "name=pol", "pattern=^none$", 'definition={"max-length": 1}')
    # raw_json prints the API's answer as it came: the same objects as the API lists.
    for kind, path, key in (
        ("connections", "/api/connections", "name"),
        ("channels", "/api/channels", "name"),
        ("consumers", "/api/consumers", "consumer_tag"),
        ("exchanges", "/api/exchanges", "name"),
        ("queues", "/api/queues", "name"),
        ("bindings", "/api/bindings", "destination"),
        ("users", "/api/users", "name"),
        ("vhosts", "/api/vhosts", "name"),
        ("permissions", "/api/permissions", "user"),
        ("nodes", "/api/nodes", "name"),
        ("policies", "/api/policies", "name"),
        ("operator_policies", "/api/operator-policies", "name"),
        ("parameters", "/api/parameters", "name"),
        ("vhost_limits", "/api/vhost-limits", "vhost"),
    ):
        assert names(admin.raw("list", kind), key) == names(api(broker, path), key), kind
    # tsv with rabbitmqadmin's default columns (asked of the API with ?columns=).
    connections = admin.tsv("list", "connections")
    assert len(connections) == 1 and connections[0]["user"] == "guest"
    assert connections[0]["channels"] == "1"
    assert admin.tsv("list", "channels")[0]["name"] == connections[0]["name"] + " (1)"
    consumers = admin.tsv("list", "consumers", "consumer_tag", "queue.name")
    assert [(c["consumer_tag"], c["queue.name"]) for c in consumers] == [("ctag", "listed")]
    assert {"name": "listed", "messages": "0"} in admin.tsv("list", "queues")
    assert {"name": "amq.topic", "type": "topic"} in admin.tsv("list", "exchanges")
    assert admin.tsv("list", "vhosts") == [{"name": "/", "messages": "0"}]
    users = admin.tsv("list", "users")
    assert [(u["name"], u["tags"]) for u in users] == [("guest", "administrator")]
    nodes = admin.tsv("list", "nodes")
    assert len(nodes) == 1 and nodes[0]["type"] == "disc" and int(nodes[0]["mem_used"]) > 0
    # Explicit columns, sorting and one vhost, as RabbitMQ answers them.
    assert admin.raw("list", "queues", "name", "durable") == [{"name": "listed", "durable": True}]
    assert admin.raw("-V", "/", "list", "bindings", "destination") == [{"destination": "listed"}]
    assert admin.raw("list", "nodes", "name") == [{"name": names(api(broker, "/api/nodes"))[0]}]
    exchanges = admin.raw("-S", "name", "-R", "list", "exchanges", "name")
    assert names(exchanges) == sorted(names(api(broker, "/api/exchanges")), reverse=True)
    # show overview: rabbitmqadmin's default columns, as a table and as tsv.
    overview = admin.tsv("show", "overview")
    assert overview[0]["object_totals.queues"] == "1"
    assert overview[0]["rabbitmq_version"] == api(broker, "/api/overview")["rabbitmq_version"]  # type: ignore[index]
    assert "object_totals.queues" in admin.ok("show", "overview")
    shown = admin.raw("show", "overview", "object_totals")
    assert isinstance(shown, list) and list(shown[0]) == ["object_totals"]
    assert shown[0]["object_totals"]["consumers"] == 1


def test_close_connection(
    admin: Admin, broker: RunningBroker, client: pika.BlockingConnection
) -> None:
    [connection] = admin.tsv("list", "connections")
    out = admin.ok("close", "connection", f"name={connection['name']}")
    assert out == "connection closed\n"
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        for _ in range(100):
            client.process_data_events(time_limit=0.1)
    assert closed.value.reply_code == 320
    assert "Closed via management plugin" in closed.value.reply_text
    assert api(broker, "/api/connections") == []
    assert "Not found" in admin.fails("close", "connection", "name=nope")


def test_delete_exchange_and_queue(admin: Admin, broker: RunningBroker) -> None:
    admin.ok("declare", "exchange", "name=gone", "type=direct")
    admin.ok("declare", "queue", "name=gone")
    assert admin.ok("delete", "exchange", "name=gone") == "exchange deleted\n"
    assert admin.ok("delete", "queue", "name=gone") == "queue deleted\n"
    assert status_of(broker, "/api/exchanges/%2F/gone") == 404
    assert status_of(broker, "/api/queues/%2F/gone") == 404
    assert "Not found" in admin.fails("delete", "queue", "name=gone")
