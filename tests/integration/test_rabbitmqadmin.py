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
import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.conftest import RunningBroker

RUN_TIMEOUT_S = 60
PACKAGE = "rabbitmq-server"
SCRIPT_NAME = "rabbitmqadmin"
PLUGIN_GLOBS = (
    "/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/rabbitmq_management-*/priv/www/cli/"
    + SCRIPT_NAME,
    "/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/rabbitmq_management-*.ez",
)
EZ_MEMBER_SUFFIX = "/priv/www/cli/" + SCRIPT_NAME


def _package_files() -> list[str]:
    """The files Debian's rabbitmq-server package installed, or [] without dpkg."""
    if shutil.which("dpkg") is None:
        return []
    listed = subprocess.run(
        ["dpkg", "-L", PACKAGE], check=False, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    return listed.stdout.splitlines() if listed.returncode == 0 else []


def _from_ez(archive: Path, into: Path) -> Path | None:
    """rabbitmqadmin extracted from a plugin's .ez (zip) archive into `into`, if it is there."""
    with zipfile.ZipFile(archive) as ez:
        for member in ez.namelist():
            if member.endswith(EZ_MEMBER_SUFFIX):
                out = into / SCRIPT_NAME
                out.write_bytes(ez.read(member))
                return out
    return None


@pytest.fixture(scope="session")
def rabbitmqadmin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rabbitmqadmin of the installed rabbitmq-server: the management plugin's copy
    (extracted when the plugin is a .ez archive), else the one on the PATH. Fails, not
    skips, when the package is missing: `make test` installs it."""
    candidates = _package_files()
    for pattern in PLUGIN_GLOBS:
        candidates += glob.glob(pattern)
    plain = [
        path
        for path in candidates
        if path.endswith("/" + SCRIPT_NAME) and "/cli/" in path and os.path.isfile(path)
    ]
    if plain:
        return Path(plain[0])
    for archive in (p for p in candidates if p.endswith(".ez") and "rabbitmq_management-" in p):
        found = _from_ez(Path(archive), tmp_path_factory.mktemp("rabbitmqadmin"))
        if found is not None:
            return found
    on_path = [p for p in candidates if p.endswith("/bin/" + SCRIPT_NAME)]
    on_path += [p for p in [shutil.which(SCRIPT_NAME)] if p is not None]
    if on_path:
        return Path(on_path[0])
    pytest.fail(
        "rabbitmqadmin not found: these tests run RabbitMQ's own rabbitmqadmin, shipped by "
        f"Debian's {PACKAGE} package (apt-get install {PACKAGE}; the Makefile installs it)"
    )


class Admin:
    """rabbitmqadmin as guest against one broker, in a clean HOME (no ~/.rabbitmqadmin.conf)."""

    def __init__(self, script: Path, broker: RunningBroker, home: Path) -> None:
        self.script = script
        self.broker = broker
        self.env = {**os.environ, "HOME": str(home)}
        self.env.pop("USERPROFILE", None)

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(self.script), "-H", "127.0.0.1"]
        command += ["-P", str(self.broker.http_port), "-u", "guest", "-p", "guest", "-t", "30"]
        return subprocess.run(
            [*command, *args],
            check=False,  # callers check the exit status: some runs must fail
            input=stdin,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env=self.env,
        )

    def ok(self, *args: str, stdin: str | None = None) -> str:
        """The standard output of a run that must succeed."""
        done = self.run(*args, stdin=stdin)
        assert done.returncode == 0, f"rabbitmqadmin {' '.join(args)}: {done.stderr}"
        return done.stdout

    def fails(self, *args: str) -> str:
        """The error of a run that must fail (rabbitmqadmin prints the API's reason)."""
        done = self.run(*args)
        assert done.returncode == 1, f"rabbitmqadmin {' '.join(args)} succeeded: {done.stdout}"
        return done.stderr

    def raw(self, *args: str) -> object:
        """`-f raw_json` output, parsed."""
        return json.loads(self.ok("-f", "raw_json", *args))

    def tsv(self, *args: str) -> list[dict[str, str]]:
        """`-f tsv` output: one dict per row, by the header line's column names."""
        lines = self.ok("-f", "tsv", *args).splitlines()
        if lines == ["No items"]:
            return []
        header = lines[0].split("\t")
        return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


@pytest.fixture
def admin(rabbitmqadmin: Path, broker: RunningBroker, tmp_path: Path) -> Admin:
    home = tmp_path / "home"
    home.mkdir()
    return Admin(rabbitmqadmin, broker, home)


def api(broker: RunningBroker, path: str) -> object:
    """GET `path` as guest: the JSON, which must be a 200."""
    status, body, _ = broker.http("GET", path)
    assert status == 200, (path, status, body)
    return body


def status_of(broker: RunningBroker, path: str) -> int:
    return broker.http("GET", path)[0]


@pytest.fixture
def client(broker: RunningBroker) -> Iterator[pika.BlockingConnection]:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            broker.amqp_port,
            blocked_connection_timeout=10,
            client_properties={"connection_name": "admin-test"},
        )
    )
    yield connection
    if connection.is_open:
        connection.close()


def names(items: object, key: str = "name") -> list[object]:
    assert isinstance(items, list)
    return [item[key] for item in items]


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
