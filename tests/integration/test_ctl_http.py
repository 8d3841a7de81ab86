"""`streamq ctl` against a running broker: every verb over the real management API.

The CLI runs in-process through `streamq.cli.main` (the broker runs on its own thread), with
its output captured; a few tests run the installed `streamq` script as a subprocess for the
real exit statuses and one-line errors. pika opens the AMQP connections the verbs act on.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
from pathlib import Path

import pika
import pytest

from streamq.cli import main
from tests.integration.conftest import PikaConnect, RunningBroker, wait_until
from tests.ports import free_port

WAIT_S = 10
CTL_TIMEOUT_S = 30


class Ctl:
    """Runs `streamq ctl --uri <the broker> ...` in-process; returns (status, out, err)."""

    def __init__(self, broker: RunningBroker, capsys: pytest.CaptureFixture[str]) -> None:
        self.port = broker.http_port
        self.uri = f"http://guest:guest@127.0.0.1:{broker.http_port}"
        self._capsys = capsys

    def __call__(self, *args: str, uri: str | None = None) -> tuple[int, str, str]:
        self._capsys.readouterr()
        status = main(["ctl", "--uri", uri or self.uri, *args])
        out, err = self._capsys.readouterr()
        return status, out, err

    def ok(self, *args: str, uri: str | None = None) -> str:
        status, out, err = self(*args, uri=uri)
        assert (status, err) == (0, ""), err
        return out

    def json(self, *args: str) -> object:
        return json.loads(self.ok(*args, "--format", "json"))

    def fails(self, *args: str, status: int = 1, uri: str | None = None) -> str:
        """The one-line error of a verb that fails with `status`."""
        got, out, err = self(*args, uri=uri)
        assert (got, out) == (status, ""), (got, out, err)
        assert err.count("\n") == 1 and err.startswith("streamq ctl: "), err
        return err.strip().removeprefix("streamq ctl: ")


@pytest.fixture
def ctl(broker: RunningBroker, capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(broker, capsys)


def rows(ctl: Ctl, *args: str) -> list[dict[str, object]]:
    listing = ctl.json(*args)
    assert isinstance(listing, list)
    return listing


# Users, vhosts and permissions.


def test_users_added_tagged_authenticated_and_deleted(ctl: Ctl) -> None:
    assert ctl.ok("add_user", "bob", "secret") == 'Added user "bob".\n'
    assert ctl.fails("add_user", "bob", "other") == "user 'bob' already exists"
    assert ctl.ok("list_users") == "user   tags\nbob    []\nguest  [administrator]\n"
    ctl.ok("set_user_tags", "bob", "monitoring", "management")
    assert {"user": "bob", "tags": ["monitoring", "management"]} in rows(ctl, "list_users")
    ctl.ok("authenticate_user", "bob", "secret")  # the tags changed, the password stayed
    assert ctl.fails("authenticate_user", "bob", "wrong") == 'user "bob" failed to authenticate'
    ctl.ok("change_password", "bob", "new")
    ctl.ok("authenticate_user", "bob", "new")
    assert {"user": "bob", "tags": ["monitoring", "management"]} in rows(ctl, "list_users")
    ctl.ok("clear_password", "bob")
    ctl.fails("authenticate_user", "bob", "new")
    ctl.ok("delete_user", "bob")
    assert ctl.fails("delete_user", "bob") == "404: Not Found"
    assert ctl.fails("change_password", "bob", "x") == "404: Not Found"
    assert rows(ctl, "list_users") == [{"user": "guest", "tags": ["administrator"]}]


def test_a_user_without_management_tag_authenticates(ctl: Ctl) -> None:
    ctl.ok("add_user", "app", "pw")  # no tags: the API answers "Not management user"
    assert ctl.ok("authenticate_user", "app", "pw") == 'User "app" authenticated.\n'
    ctl.fails("authenticate_user", "app", "nope")


def test_vhosts_and_permissions(ctl: Ctl) -> None:
    ctl.ok("add_vhost", "dev")
    assert ctl.fails("add_vhost", "dev") == "vhost 'dev' already exists"
    assert ctl.ok("list_vhosts") == "name\n/\ndev\n"
    ctl.ok("add_user", "bob", "x")
    ctl.ok("set_permissions", "-p", "dev", "bob", "^bob-.*", "", ".*")
    assert ctl.ok("list_permissions", "-p", "dev") == (
        'user  configure  write  read\nbob   ^bob-.*    ""     .*\n'
    )
    assert rows(ctl, "list_user_permissions", "bob") == [
        {"vhost": "dev", "configure": "^bob-.*", "write": "", "read": ".*"}
    ]
    assert ctl.fails("set_permissions", "bob", "(", ".*", ".*").startswith("400: ")
    ctl.ok("clear_permissions", "-p", "dev", "bob")
    assert rows(ctl, "list_user_permissions", "bob") == []
    ctl.ok("delete_vhost", "dev")
    assert rows(ctl, "list_vhosts") == [{"name": "/"}]
    assert ctl.fails("delete_vhost", "dev").startswith("404: ")
    assert ctl.fails("list_permissions", "-p", "dev").startswith("404: ")


def test_names_with_slashes_spaces_and_unicode(ctl: Ctl) -> None:
    ctl.ok("add_vhost", "team/a b")
    ctl.ok("set_permissions", "-p", "team/a b", "guest", ".*", ".*", ".*")
    ctl.ok("create_queue", "-p", "team/a b", "jobs/å ä?#")
    assert ctl.ok("list_queues", "name", "-p", "team/a b") == "name\njobs/å ä?#\n"
    ctl.ok("delete_queue", "-p", "team/a b", "jobs/å ä?#")
    ctl.ok("delete_vhost", "team/a b")


def test_hash_password_gives_a_hash_the_broker_accepts(
    ctl: Ctl, pika_connect: PikaConnect, monkeypatch: pytest.MonkeyPatch
) -> None:
    password_hash = ctl.ok("hash_password", "s3cret").strip()
    definitions = {
        "users": [{"name": "eve", "password_hash": password_hash, "tags": ""}],
        "permissions": [
            {"user": "eve", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
        ],
    }
    monkeypatch.setattr(
        sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(definitions).encode()))
    )
    assert ctl.ok("import_definitions", "-") == "Imported definitions from -.\n"
    ctl.ok("authenticate_user", "eve", "s3cret")
    pika_connect("/", "eve", "s3cret").close()


# Queues and exchanges.


def test_queues_created_listed_purged_and_deleted(ctl: Ctl, pika_connect: PikaConnect) -> None:
    ctl.ok(
        "create_queue",
        "jobs",
        "--durable",
        "--max-length",
        "100",
        "--message-ttl",
        "60000",
        "--dead-letter-exchange",
        "dlx",
        "--dead-letter-routing-key",
        "dead",
        "--reject-on-overflow",
        "--delivery-limit",
        "3",
        "--expires",
        "3600000",
    )
    ctl.ok("create_queue", "log", "--stream-queue")
    ctl.ok("create_queue", "temp", "--auto-delete")
    channel = pika_connect().channel()
    channel.confirm_delivery()
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", "jobs", body)
    listing = {row["name"]: row for row in rows(ctl, "list_queues")}
    assert listing["jobs"]["durable"] is True
    assert listing["jobs"]["type"] == "classic"
    assert listing["log"]["type"] == "stream"
    assert listing["log"]["durable"] is True  # --stream-queue implies --durable
    assert listing["temp"]["durable"] is False
    wait_until(
        lambda: {r["name"]: r for r in rows(ctl, "list_queues")}["jobs"]["messages"] == 3,
        "3 messages",
    )
    arguments = {r["name"]: r["arguments"] for r in rows(ctl, "list_queues", "name", "arguments")}
    assert arguments["jobs"] == {
        "x-expires": 3600000,
        "x-max-length": 100,
        "x-message-ttl": 60000,
        "x-delivery-limit": 3,
        "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "dlx",
        "x-dead-letter-routing-key": "dead",
    }
    assert arguments["log"] == {"x-queue-type": "stream"}
    table = ctl.ok("list_queues", "name", "messages").splitlines()
    assert table[0] == "name  messages"
    assert "jobs         3" in table
    assert ctl.ok("purge_queue", "jobs") == 'Purged queue "jobs" in vhost "/".\n'
    wait_until(lambda: rows(ctl, "list_queues", "name", "messages")[0]["messages"] == 0, "purge")
    ctl.ok("delete_queue", "jobs")
    assert ctl.fails("delete_queue", "jobs").startswith("404: ")
    assert ctl.fails("purge_queue", "jobs").startswith("404: ")
    assert ctl.fails("create_queue", "log").startswith("400: ")  # inequivalent redeclare


def test_delete_queue_if_empty(ctl: Ctl, pika_connect: PikaConnect) -> None:
    ctl.ok("create_queue", "full")
    channel = pika_connect().channel()
    channel.confirm_delivery()
    channel.basic_publish("", "full", b"x")
    status, _, err = ctl("delete_queue", "full", "--if-empty")
    assert status == 1 and err.startswith("streamq ctl: 4"), err
    ctl.ok("delete_queue", "full")


def test_exchanges_created_listed_and_deleted(ctl: Ctl) -> None:
    ctl.ok("create_exchange", "fanout", "ae", "--durable")
    ctl.ok("create_exchange", "topic", "events", "--durable", "--alternate-exchange", "ae")
    ctl.ok("create_exchange", "direct", "later", "--delayed")
    ctl.ok("create_exchange", "headers", "inside", "--internal", "--auto-delete")
    found = {
        row["name"]: row
        for row in rows(
            ctl, "list_exchanges", "name", "type", "durable", "internal", "auto_delete", "arguments"
        )
    }
    assert found["events"] == {
        "name": "events",
        "type": "topic",
        "durable": True,
        "internal": False,
        "auto_delete": False,
        "arguments": {"alternate-exchange": "ae"},
    }
    assert found["later"]["type"] == "x-delayed-message"
    assert found["later"]["arguments"] == {"x-delayed-type": "direct"}
    assert (found["inside"]["internal"], found["inside"]["auto_delete"]) == (True, True)
    assert "amq.topic" in found
    assert ctl.ok("list_exchanges").splitlines()[1].startswith('""  ')  # the default exchange
    ctl.ok("delete_exchange", "events")
    assert "events" not in {row["name"] for row in rows(ctl, "list_exchanges")}
    assert ctl.fails("delete_exchange", "events").startswith("404: ")
    assert ctl.fails("create_exchange", "nonsense", "x").startswith("400: ")


# Policies.


def test_policies_set_listed_and_cleared(ctl: Ctl) -> None:
    ctl.ok(
        "set_policy", "cap", "^s", '{"max-length": 5}', "--priority", "3", "--apply-to", "queues"
    )
    assert ctl.ok("list_policies").splitlines() == [
        "vhost  name  pattern  apply-to  definition         priority",
        '/      cap   ^s       queues    {"max-length": 5}         3',
    ]
    assert ctl.fails("set_policy", "cap", "^s", "{oops").startswith("the definition is not JSON")
    ctl.ok("clear_policy", "cap")
    assert rows(ctl, "list_policies") == []
    assert ctl.fails("clear_policy", "cap") == "404: Not Found"


# Connections.


def connection_names(ctl: Ctl, *args: str) -> list[str]:
    return [str(row["name"]) for row in rows(ctl, "list_connections", *args)]


def test_connections_listed_and_closed(ctl: Ctl, pika_connect: PikaConnect) -> None:
    first, second = pika_connect(), pika_connect()
    reasons: dict[int, tuple[int, str]] = {}

    def closed(conn: pika.BlockingConnection) -> bool:
        if id(conn) in reasons or conn.is_closed:
            return True
        try:
            conn.process_data_events(time_limit=0)
        except pika.exceptions.ConnectionClosedByBroker as exc:
            reasons[id(conn)] = (exc.reply_code, exc.reply_text)
            return True
        return conn.is_closed

    def listed_after_clients_read(count: int) -> bool:
        # The broker keeps a closed connection until the client's close-ok (as RabbitMQ):
        # the clients read what came, as live clients do.
        closed(first)
        closed(second)
        return len(connection_names(ctl)) == count

    wait_until(lambda: len(connection_names(ctl)) == 2, "two connections")
    listing = rows(ctl, "list_connections")
    assert {(row["user"], row["vhost"], row["state"]) for row in listing} == {
        ("guest", "/", "running")
    }
    assert (
        ctl.ok("list_connections").splitlines()[0]
        == "name" + " " * (len(str(listing[0]["name"])) - 2) + "user   vhost  state    channels"
    )
    assert connection_names(ctl, "-p", "other") == []
    name = connection_names(ctl)[0]
    assert ctl.ok("close_connection", name, "maintenance") == f'Closed connection "{name}".\n'
    wait_until(lambda: listed_after_clients_read(1), "one connection closed")
    assert ctl.fails("close_connection", name).startswith("404: ")
    ctl.ok("add_vhost", "other")
    assert ctl.ok("close_all_connections", "-p", "other") == "Closed 0 connections.\n"
    remaining = connection_names(ctl)
    out = ctl.ok("close_all_connections", "bye")
    assert out == f"Closed 1 connection.\n  {remaining[0]}\n"
    wait_until(lambda: listed_after_clients_read(0), "all connections closed")

    wait_until(lambda: closed(first) and closed(second), "pika to see the closes")
    assert sorted(reasons.values()) == [
        (320, "CONNECTION_FORCED - bye"),
        (320, "CONNECTION_FORCED - maintenance"),
    ]


# Definitions and status.


def test_definitions_exported_and_imported(ctl: Ctl, tmp_path: Path) -> None:
    ctl.ok("create_queue", "keep", "--durable")
    ctl.ok("add_vhost", "dev")
    file = tmp_path / "defs.json"
    assert ctl.ok("export_definitions", str(file)) == f"Exported definitions to {file}.\n"
    exported = json.loads(file.read_text())
    assert {"name": "keep", "vhost": "/"}.items() <= next(
        q for q in exported["queues"] if q["name"] == "keep"
    ).items()
    assert {v["name"] for v in exported["vhosts"]} == {"/", "dev"}
    assert json.loads(ctl.ok("export_definitions")) == exported  # stdout
    per_vhost = json.loads(ctl.ok("export_definitions", "-p", "/"))
    assert "vhosts" not in per_vhost and any(q["name"] == "keep" for q in per_vhost["queues"])
    ctl.ok("delete_queue", "keep")
    ctl.ok("delete_vhost", "dev")
    assert ctl.ok("import_definitions", str(file)) == f"Imported definitions from {file}.\n"
    assert "keep" in {row["name"] for row in rows(ctl, "list_queues")}
    assert {row["name"] for row in rows(ctl, "list_vhosts")} == {"/", "dev"}


def test_definitions_files_that_cannot_be_imported(ctl: Ctl, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    assert ctl.fails("import_definitions", str(bad)).startswith(f"{bad} is not JSON")
    assert ctl.fails("import_definitions", str(tmp_path / "none.json")) == (
        f"cannot read {tmp_path / 'none.json'}: No such file or directory"
    )
    bad.write_text('{"queues": "not a list"}')
    assert ctl.fails("import_definitions", str(bad)).startswith("400: ")
    assert ctl.fails("export_definitions", str(tmp_path / "no" / "dir.json")).startswith(
        "cannot write"
    )


def test_status(ctl: Ctl, broker: RunningBroker, pika_connect: PikaConnect) -> None:
    pika_connect()
    wait_until(lambda: ctl.json("status")["connections"] == 1, "the connection counted")  # type: ignore[index]
    status = ctl.json("status")
    assert isinstance(status, dict)
    assert status["product"] == "streamq"
    assert {"version", "node", "queues", "exchanges", "messages", "uptime_s"} <= status.keys()
    assert f"amqp 127.0.0.1:{broker.amqp_port}" in status["listeners"]
    assert status["alarms"] == []
    lines = ctl.ok("status").splitlines()
    assert "connections              1" in lines
    assert "alarms                   []" in lines


def test_status_of_a_management_user_leaves_out_the_node(ctl: Ctl) -> None:
    ctl.ok("add_user", "manager", "pw")
    ctl.ok("set_user_tags", "manager", "management")
    ctl.ok("set_permissions", "manager", ".*", ".*", ".*")
    status = json.loads(ctl.ok("status", "--json", uri=f"http://manager:pw@127.0.0.1:{ctl.port}"))
    assert status["product"] == "streamq"
    assert "uptime_s" not in status  # /api/nodes needs the monitoring tag


# Errors: every failure is one line on stderr and an exit status, never a traceback.


def test_login_failed_and_not_allowed(ctl: Ctl) -> None:
    wrong = f"http://guest:wrong@127.0.0.1:{ctl.port}"
    assert ctl.fails("list_queues", uri=wrong, status=77) == "401: Login failed"
    ctl.ok("add_user", "watcher", "pw")
    ctl.ok("set_user_tags", "watcher", "monitoring")
    watcher = f"http://watcher:pw@127.0.0.1:{ctl.port}"
    assert ctl.fails("add_vhost", "x", uri=watcher, status=77).startswith("403: ")
    ctl.ok("add_user", "app", "pw")
    app = f"http://app:pw@127.0.0.1:{ctl.port}"
    assert ctl.fails("list_queues", uri=app, status=77) == "401: Not management user"


def streamq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamq", "ctl", *args],
        capture_output=True,
        text=True,
        timeout=CTL_TIMEOUT_S,
        check=False,
    )


def test_no_broker_is_exit_69() -> None:
    port = free_port()
    done = streamq("add_user", "bob", "x", "--uri", f"http://guest:guest@127.0.0.1:{port}")
    assert (done.returncode, done.stdout) == (69, "")
    assert done.stderr == (
        f"streamq ctl: no broker answers at 127.0.0.1:{port} "
        "(if the broker is stopped, give --data-dir to edit its accounts)\n"
    )


def test_a_silent_server_times_out() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        done = streamq("status", "--timeout", "0.3", "--uri", f"http://127.0.0.1:{port}")
    assert done.returncode == 69
    assert done.stderr == f"streamq ctl: no answer from 127.0.0.1:{port} within 0.3 s\n"


def test_the_script_against_a_broker(broker: RunningBroker) -> None:
    uri = f"http://guest:guest@127.0.0.1:{broker.http_port}"
    done = streamq("create_queue", "q", "--durable", "--uri", uri)
    assert (done.returncode, done.stderr) == (0, "")
    done = subprocess.run(
        [sys.executable, "-m", "streamq", "ctl", "list_queues", "name", "durable"],
        capture_output=True,
        text=True,
        timeout=CTL_TIMEOUT_S,
        check=False,
        env={"STREAMQ_CTL_URI": uri, "PATH": "/usr/bin:/bin"},
    )
    assert done.stdout.splitlines() == ["name  durable", "q     true"], done.stderr
    done = streamq("delete_queue", "q", "--uri", uri)
    assert done.returncode == 0
    done = streamq("delete_queue", "q", "--uri", uri)
    assert done.returncode == 1
    assert done.stderr.startswith("streamq ctl: 404: ") and "Traceback" not in done.stderr
