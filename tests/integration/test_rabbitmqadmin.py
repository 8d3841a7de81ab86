"""RabbitMQ's own rabbitmqadmin against streamq's management API.

Goal: every rabbitmqadmin command works against streamq as against RabbitMQ. Method: run
the real script that Debian's rabbitmq-server package ships (found with `dpkg -L`, taken
out of the management plugin's .ez archive where it is zipped) in a subprocess against
the in-process broker, and check what the broker became through the HTTP API or pika,
not only the exit status. rabbitmqadmin sends the `name=value` arguments it does not
parse as JSON as strings (`"durable": "false"`, `"count": "2"`), which is what broke.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pika

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


# -- declare, with the string booleans and arguments rabbitmqadmin sends -------------------


def test_declare_exchanges_with_flags_and_arguments(admin: Admin, broker: RunningBroker) -> None:
    admin.ok("declare", "exchange", "name=x.default", "type=topic")
    admin.ok(
        "declare",
        "exchange",
        "name=x.flags",
        "type=fanout",
        "durable=false",
        "auto_delete=true",
        "internal=true",
        'arguments={"alternate-exchange": "x.default"}',
    )
    shown = api(broker, "/api/exchanges/%2F/x.default")
    assert isinstance(shown, dict) and shown["type"] == "topic"
    assert (shown["durable"], shown["auto_delete"], shown["internal"]) == (True, False, False)
    shown = api(broker, "/api/exchanges/%2F/x.flags")
    assert isinstance(shown, dict) and shown["type"] == "fanout"
    assert (shown["durable"], shown["auto_delete"], shown["internal"]) == (False, True, True)
    assert shown["arguments"] == {"alternate-exchange": "x.default"}
    # Declaring it again the same way is no change; another durability is RabbitMQ's 400.
    admin.ok("declare", "exchange", "name=x.default", "type=topic", "durable=true")
    error = admin.fails("declare", "exchange", "name=x.default", "type=topic", "durable=false")
    assert "inequivalent arg 'durable'" in error
    # A value that is no boolean, even as a string, is still refused and names the field.
    assert "internal must be true or false" in admin.fails(
        "declare", "exchange", "name=x.bad", "type=direct", "internal=yes"
    )
    assert status_of(broker, "/api/exchanges/%2F/x.bad") == 404


def test_declare_queues_with_flags_arguments_and_types(
    admin: Admin, broker: RunningBroker, client: pika.BlockingConnection
) -> None:
    assert admin.ok("declare", "queue", "name=q.durable") == "queue declared\n"
    admin.ok("declare", "queue", "name=q.transient", "durable=false", "auto_delete=true")
    admin.ok("declare", "queue", "name=q.limited", 'arguments={"x-max-length": 2}')
    admin.ok("declare", "queue", "name=q.stream", "queue_type=stream")
    shown = api(broker, "/api/queues/%2F/q.durable")
    assert isinstance(shown, dict)
    assert (shown["durable"], shown["auto_delete"], shown["arguments"]) == (True, False, {})
    shown = api(broker, "/api/queues/%2F/q.transient")
    assert isinstance(shown, dict) and (shown["durable"], shown["auto_delete"]) == (False, True)
    shown = api(broker, "/api/queues/%2F/q.limited")
    assert isinstance(shown, dict) and shown["arguments"] == {"x-max-length": 2}
    shown = api(broker, "/api/queues/%2F/q.stream")
    assert isinstance(shown, dict) and shown["type"] == "stream" and shown["durable"] is True
    # The length limit the JSON argument set applies to AMQP publishes.
    channel = client.channel()
    channel.confirm_delivery()
    for body in (b"1", b"2", b"3"):
        channel.basic_publish("", "q.limited", body)
    shown = api(broker, "/api/queues/%2F/q.limited")
    assert isinstance(shown, dict) and shown["messages"] == 2
    # Bad values are still 400s naming the field; nothing is declared.
    assert "durable must be true or false" in admin.fails(
        "declare", "queue", "name=q.bad", "durable=True"
    )
    assert "auto_delete must be true or false" in admin.fails(
        "declare", "queue", "name=q.bad", "auto_delete=1"
    )
    assert status_of(broker, "/api/queues/%2F/q.bad") == 404


def test_bindings_declare_route_and_delete(
    admin: Admin, broker: RunningBroker, client: pika.BlockingConnection
) -> None:
    admin.ok("declare", "exchange", "name=src", "type=direct")
    admin.ok("declare", "exchange", "name=hop", "type=fanout")
    admin.ok("declare", "queue", "name=dst")
    admin.ok("declare", "queue", "name=via-hop")
    admin.ok("declare", "binding", "source=src", "destination=dst", "routing_key=k1")
    admin.ok(
        "declare",
        "binding",
        "source=src",
        "destination=hop",
        "destination_type=exchange",
        "routing_key=k2",
    )
    admin.ok("declare", "binding", "source=hop", "destination=via-hop")
    bound = api(broker, "/api/exchanges/%2F/src/bindings/source")
    assert isinstance(bound, list)
    assert sorted((b["destination"], b["destination_type"], b["routing_key"]) for b in bound) == [
        ("dst", "queue", "k1"),
        ("hop", "exchange", "k2"),
    ]
    channel = client.channel()
    channel.confirm_delivery()
    channel.basic_publish("src", "k1", b"direct")
    channel.basic_publish("src", "k2", b"through hop")
    assert channel.basic_get("dst", auto_ack=True)[2] == b"direct"
    assert channel.basic_get("via-hop", auto_ack=True)[2] == b"through hop"
    listed = admin.tsv("list", "bindings")
    assert {"source": "src", "destination": "dst", "routing_key": "k1"} in listed
    admin.ok(
        "delete",
        "binding",
        "source=src",
        "destination_type=queue",
        "destination=dst",
        "properties_key=k1",
    )
    admin.ok("delete", "binding", "source=hop", "destination_type=queue", "destination=via-hop")
    assert api(broker, "/api/bindings/%2F/e/src/q/dst") == []
    assert api(broker, "/api/bindings/%2F/e/hop/q/via-hop") == []
    assert names(api(broker, "/api/exchanges/%2F/src/bindings/source"), "destination") == ["hop"]


# -- publish, get, purge ------------------------------------------------------------------


def test_publish_with_properties_and_get_with_each_ackmode(
    admin: Admin, broker: RunningBroker, client: pika.BlockingConnection, tmp_path: Path
) -> None:
    admin.ok("declare", "exchange", "name=ex", "type=direct")
    admin.ok("declare", "queue", "name=inbox")
    admin.ok("declare", "binding", "source=ex", "destination=inbox", "routing_key=rk")
    properties = '{"delivery_mode": 2, "content_type": "text/plain", "headers": {"h": "v"}}'
    for n in (1, 2, 3):
        out = admin.ok(
            "publish",
            "exchange=ex",
            "routing_key=rk",
            f"payload=hello {n}",
            f"properties={properties}",
        )
        assert out == "Message published\n"
    assert admin.ok("publish", "routing_key=nowhere", "payload=x") == (
        "Message published but NOT routed\n"
    )
    # count=2 (sent as "2"), requeued: the queue keeps all three.
    got = admin.raw("get", "queue=inbox", "count=2")
    assert isinstance(got, list) and [m["payload"] for m in got] == ["hello 1", "hello 2"]
    first = got[0]
    assert first["exchange"] == "ex" and first["routing_key"] == "rk"
    assert first["properties"]["delivery_mode"] == 2
    assert first["properties"]["content_type"] == "text/plain"
    assert first["properties"]["headers"] == {"h": "v"}
    shown = api(broker, "/api/queues/%2F/inbox")
    assert isinstance(shown, dict) and shown["messages"] == 3
    # The table rabbitmqadmin prints by default shows the payload.
    table = admin.ok("get", "queue=inbox")
    assert "hello 1" in table and "payload_encoding" in table
    # payload_file: the body goes to the file (and the key is ignored by the broker).
    target = tmp_path / "payload.txt"
    admin.ok("get", "queue=inbox", f"payload_file={target}")
    assert target.read_text() == "hello 1"
    # ack_requeue_false takes them for good.
    rows = admin.tsv("get", "queue=inbox", "count=3", "ackmode=ack_requeue_false")
    assert [r["payload"] for r in rows] == ["hello 1", "hello 2", "hello 3"]
    assert [r["redelivered"] for r in rows] == ["True", "True", "False"]  # m3 never got
    shown = api(broker, "/api/queues/%2F/inbox")
    assert isinstance(shown, dict) and shown["messages"] == 0
    # A body from standard input goes base64-encoded, bytes preserved.
    admin.ok("publish", "exchange=ex", "routing_key=rk", stdin="from stdin é")
    channel = client.channel()
    method, _, body = channel.basic_get("inbox", auto_ack=True)
    assert method is not None and body == "from stdin é".encode()
    # A count that is no integer is still refused.
    assert "count must be an integer from 0 to 10000" in admin.fails(
        "get", "queue=inbox", "count=1.5"
    )


def test_get_reject_modes_and_purge(admin: Admin, broker: RunningBroker) -> None:
    admin.ok("declare", "exchange", "name=dlx", "type=fanout")
    admin.ok("declare", "queue", "name=dead")
    admin.ok("declare", "binding", "source=dlx", "destination=dead")
    admin.ok("declare", "queue", "name=work", 'arguments={"x-dead-letter-exchange": "dlx"}')
    for n in range(4):
        admin.ok("publish", "routing_key=work", f"payload=m{n}")
    got = admin.raw("get", "queue=work", "count=1", "ackmode=reject_requeue_true")
    assert isinstance(got, list) and got[0]["payload"] == "m0"
    got = admin.raw("get", "queue=work", "count=1", "ackmode=reject_requeue_false")
    assert isinstance(got, list) and got[0]["payload"] == "m0"
    dead = api(broker, "/api/queues/%2F/dead")
    assert isinstance(dead, dict) and dead["messages"] == 1
    assert admin.ok("purge", "queue", "name=work") == "queue purged\n"
    work = api(broker, "/api/queues/%2F/work")
    assert isinstance(work, dict) and work["messages"] == 0


# -- definitions ---------------------------------------------------------------------------


def test_export_and_import(admin: Admin, broker: RunningBroker, tmp_path: Path) -> None:
    admin.ok("declare", "vhost", "name=v2")
    admin.ok("declare", "user", "name=carol", "password=pw", "tags=monitoring")
    admin.ok("declare", "permission", "vhost=v2", "user=carol", "configure=.*", "write=", "read=.*")
    admin.ok("declare", "exchange", "name=kept", "type=topic")
    admin.ok("declare", "queue", "name=kept", 'arguments={"x-max-length": 7}')
    admin.ok("declare", "binding", "source=kept", "destination=kept", "routing_key=a.#")
    admin.ok("declare", "policy", "name=p", "pattern=^kept$", 'definition={"max-length": 3}')
    # RabbitMQ grants the user who creates a vhost over HTTP full permissions on it;
    # streamq does not (docs/management.md), so guest gets them as any other user would.
    guest = ("vhost=v2", "user=guest", "configure=.*", "write=.*", "read=.*")
    admin.ok("declare", "permission", *guest)
    admin.ok("-V", "v2", "declare", "queue", "name=v2q")
    everything = tmp_path / "all.json"
    out = admin.ok("export", str(everything))
    assert out.startswith("Exported definitions")
    document = json.loads(everything.read_text())
    assert {k: v for k, v in document["queues"][0].items() if k != "arguments"} == {
        "name": "kept",
        "vhost": "/",
        "durable": True,
        "auto_delete": False,
    }
    assert document["queues"][0]["arguments"] == {"x-max-length": 7}
    one_vhost = tmp_path / "v2.json"
    admin.ok("-V", "v2", "export", str(one_vhost))
    assert names(json.loads(one_vhost.read_text())["queues"]) == ["v2q"]
    # Delete it all, then import the two files back.
    for args in (
        ("delete", "queue", "name=kept"),
        ("delete", "exchange", "name=kept"),
        ("delete", "policy", "name=p"),
        ("delete", "user", "name=carol"),
        ("delete", "vhost", "name=v2"),
    ):
        admin.ok(*args)
    assert status_of(broker, "/api/queues/%2F/kept") == 404
    assert admin.ok("import", str(everything)).startswith("Uploaded definitions")
    admin.ok("-V", "v2", "import", str(one_vhost))
    queue = api(broker, "/api/queues/%2F/kept")
    assert isinstance(queue, dict) and queue["arguments"] == {"x-max-length": 7}
    assert queue["policy"] == "p"
    assert names(api(broker, "/api/bindings/%2F/e/kept/q/kept"), "routing_key") == ["a.#"]
    permission = api(broker, "/api/permissions/v2/carol")
    assert isinstance(permission, dict) and permission["write"] == ""
    assert names(api(broker, "/api/queues/v2")) == ["v2q"]
    exported_again = tmp_path / "again.json"
    admin.ok("export", str(exported_again))
    again = json.loads(exported_again.read_text())
    for key in ("users", "vhosts", "permissions", "policies", "queues", "exchanges", "bindings"):
        assert again[key] == document[key], key


def test_string_flags_in_a_definitions_file(
    admin: Admin, broker: RunningBroker, tmp_path: Path
) -> None:
    """A hand-written file may say "true" as rabbitmqadmin does; streamq takes it (RabbitMQ
    3.10 refuses it with a function_clause error)."""
    document = {
        "queues": [
            {
                "name": "hand",
                "vhost": "/",
                "durable": "false",
                "auto_delete": "false",
                "arguments": {},
            }
        ],
        "exchanges": [
            {
                "name": "hand.x",
                "vhost": "/",
                "type": "direct",
                "durable": "true",
                "auto_delete": "false",
                "internal": "false",
                "arguments": {},
            }
        ],
    }
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(document))
    admin.ok("import", str(path))
    queue = api(broker, "/api/queues/%2F/hand")
    assert isinstance(queue, dict) and queue["durable"] is False
    exchange = api(broker, "/api/exchanges/%2F/hand.x")
    assert isinstance(exchange, dict) and exchange["durable"] is True
    document["queues"][0]["durable"] = "no"
    path.write_text(json.dumps(document))
    assert "durable must be true or false in " in admin.fails("import", str(path))


def test_base64_payload_and_help(admin: Admin, client: pika.BlockingConnection) -> None:
    admin.ok("declare", "queue", "name=bin")
    encoded = base64.b64encode(b"\x00\xffbin").decode()
    admin.ok("publish", "routing_key=bin", f"payload={encoded}", "payload_encoding=base64")
    got = admin.raw("get", "queue=bin", "encoding=base64")
    assert isinstance(got, list) and got[0]["payload"] == encoded
    method, _, body = client.channel().basic_get("bin", auto_ack=True)
    assert method is not None and body == b"\x00\xffbin"
    assert "rabbitmqadmin" in admin.ok("--version")
