"""Users, vhosts, permissions, overview, nodes and the aliveness test over the management
API, with the AMQP side checked through pika: an account made over HTTP logs in at once,
a vhost created over HTTP takes connections at once, a deleted one closes them."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from http_gateway import auth
from tests.integration.conftest import RunningBroker
from tests.integration.test_http_definitions import call, connect

ADMIN = ("guest", "guest")
MGMT = ("mgmt", "mgmt-pw")
MONITOR = ("mon", "mon-pw")
PLAIN = ("plain", "plain-pw")  # no tags


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningBroker]:
    broker = RunningBroker(tmp_path / "data")
    for (name, password), tags in ((MGMT, "management"), (MONITOR, "monitoring"), (PLAIN, "")):
        assert (
            call(broker, "PUT", f"/api/users/{name}", {"password": password, "tags": tags})[0]
            == 201
        )
    assert call(broker, "PUT", "/api/vhosts/mine")[0] == 201
    full = {"configure": ".*", "write": ".*", "read": ".*"}
    assert call(broker, "PUT", "/api/permissions/mine/mgmt", full)[0] == 201
    yield broker
    broker.stop()


def test_whoami_and_the_401s(running: RunningBroker) -> None:
    assert call(running, "GET", "/api/whoami") == (
        200,
        {"name": "guest", "tags": ["administrator"]},
    )
    assert call(running, "GET", "/api/whoami", user=MGMT)[1] == {
        "name": "mgmt",
        "tags": ["management"],
    }
    status, body = call(running, "GET", "/api/whoami", user=("guest", "wrong"))
    assert (status, body) == (401, {"error": "not_authorised", "reason": "Login failed"})
    status, body = call(running, "GET", "/api/whoami", user=PLAIN)
    assert (status, body) == (401, {"error": "not_authorised", "reason": "Not management user"})


def test_users_put_get_list_delete(running: RunningBroker) -> None:
    assert (
        call(
            running, "PUT", "/api/users/u1", {"password": "p1", "tags": "administrator,monitoring"}
        )[0]
        == 201
    )
    status, user = call(running, "GET", "/api/users/u1")
    assert status == 200 and isinstance(user, dict)
    assert user["tags"] == ["administrator", "monitoring"]
    assert user["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    # Replace by hash (RabbitMQ's format): the old hash logs in with the old password.
    body = {"password_hash": user["password_hash"], "tags": ["management"]}
    assert call(running, "PUT", "/api/users/u2", body)[0] == 201
    assert call(running, "GET", "/api/whoami", user=("u2", "p1"))[1] == {
        "name": "u2",
        "tags": ["management"],
    }
    assert call(running, "PUT", "/api/users/u2", {"password": "new", "tags": []})[0] == 204
    assert call(running, "GET", "/api/whoami", user=("u2", "p1"))[0] == 401
    status, users = call(running, "GET", "/api/users")
    assert status == 200 and isinstance(users, list)
    assert [u["name"] for u in users] == ["guest", "mgmt", "mon", "plain", "u1", "u2"]
    # Without a password nor a hash, password logins fail (RabbitMQ clears it).
    assert call(running, "PUT", "/api/users/u1", {"tags": "administrator"})[0] == 204
    assert call(running, "GET", "/api/whoami", user=("u1", "p1"))[0] == 401
    status, without = call(running, "GET", "/api/users/without-permissions")
    assert status == 200 and isinstance(without, list)
    assert "mgmt" not in [u["name"] for u in without] and "u1" in [u["name"] for u in without]
    assert call(running, "DELETE", "/api/users/u1")[0] == 204
    assert call(running, "GET", "/api/users/u1")[0] == 404
    assert call(running, "DELETE", "/api/users/u1")[0] == 404


def test_bad_user_bodies_are_400(running: RunningBroker) -> None:
    for body in (
        b"{not json",
        [],
        {"password": 5},
        {"password": "p", "tags": 5},
        {"password": "p", "tags": ["a", 1]},
        {"password_hash": "not-a-hash"},
        {"password_hash": "AQIDBA==", "hashing_algorithm": "rabbit_password_hashing_md5"},
    ):
        assert call(running, "PUT", "/api/users/bad", body)[0] == 400, body
    assert call(running, "PUT", "/api/users/" + "x" * 300, {"password": "p"})[0] == 400
    assert call(running, "GET", "/api/users/bad")[0] == 404


def test_bulk_delete(running: RunningBroker) -> None:
    for name in ("b1", "b2"):
        call(running, "PUT", f"/api/users/{name}", {"password": "p"})
    status, body = call(running, "POST", "/api/users/bulk-delete", {"users": ["b1", "nope"]})
    assert status == 400 and isinstance(body, dict) and "nope" in str(body["reason"])
    assert call(running, "GET", "/api/users/b1")[0] == 404  # the others went, as in RabbitMQ
    assert call(running, "POST", "/api/users/bulk-delete", {"users": ["b2"]})[0] == 204
    assert call(running, "POST", "/api/users/bulk-delete", {})[0] == 400
    assert call(running, "POST", "/api/users/bulk-delete", {"users": "b2"})[0] == 400


def test_vhost_created_over_http_takes_connections_and_deletion_closes_them(
    running: RunningBroker,
) -> None:
    assert call(running, "PUT", "/api/vhosts/live")[0] == 201
    assert call(running, "PUT", "/api/vhosts/live", {"description": "x"})[0] == 204
    # As RabbitMQ's: the vhost's creator may use it at once.
    full = {"configure": ".*", "write": ".*", "read": ".*"}
    status, granted = call(running, "GET", "/api/permissions/live/guest")
    assert status == 200 and isinstance(granted, dict)
    assert {kind: granted[kind] for kind in full} == full
    assert call(running, "PUT", "/api/permissions/live/guest", full)[0] == 204
    conn = connect(running, "guest", "guest", "live")
    channel = conn.channel()
    channel.queue_declare("q", durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", "q", b"hello")
    status, vhost = call(running, "GET", "/api/vhosts/live")
    assert status == 200 and isinstance(vhost, dict) and vhost["messages_ready"] == 1
    directory = running.broker.vhost_directory("live") if running.broker else ""
    assert Path(directory).is_dir()
    assert call(running, "DELETE", "/api/vhosts/live")[0] == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker, match="320"):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            conn.process_data_events(0.05)
    assert not Path(directory).exists()
    assert call(running, "GET", "/api/vhosts/live")[0] == 404
    assert call(running, "DELETE", "/api/vhosts/live")[0] == 404
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect(running, "guest", "guest", "live")
    # Created again, it is empty.
    assert call(running, "PUT", "/api/vhosts/live")[0] == 201
    with (
        connect(running, "guest", "guest", "live") as again,
        pytest.raises(pika.exceptions.ChannelClosedByBroker, match="404"),
    ):
        again.channel().queue_declare("q", passive=True)


def test_vhost_visibility_and_admin_only_changes(running: RunningBroker) -> None:
    status, shown = call(running, "GET", "/api/vhosts", user=MGMT)
    assert status == 200 and [v["name"] for v in shown] == ["mine"]  # type: ignore[union-attr]
    status, shown = call(running, "GET", "/api/vhosts", user=MONITOR)
    assert [v["name"] for v in shown] == ["/", "mine"]  # type: ignore[union-attr]
    assert call(running, "GET", "/api/vhosts/mine", user=MGMT)[0] == 200
    assert call(running, "GET", "/api/vhosts/%2F", user=MGMT)[0] == 403
    assert call(running, "GET", "/api/vhosts/nope")[0] == 404
    for method in ("PUT", "DELETE"):
        assert call(running, method, "/api/vhosts/mine", user=MGMT)[0] == 403
        assert call(running, method, "/api/vhosts/mine", user=MONITOR)[0] == 403
    assert call(running, "PUT", "/api/vhosts/x", b"[1]")[0] == 400
    assert call(running, "PUT", "/api/vhosts/" + "v" * 300)[0] == 400


def test_permissions_routes(running: RunningBroker) -> None:
    status, found = call(running, "GET", "/api/vhosts/mine/permissions")
    # guest created "mine" (the fixture), and was granted everything on it.
    assert status == 200 and [p["user"] for p in found] == ["guest", "mgmt"]  # type: ignore[union-attr]
    assert call(running, "GET", "/api/vhosts/nope/permissions")[0] == 404
    status, found = call(running, "GET", "/api/users/mgmt/permissions")
    assert status == 200 and [p["vhost"] for p in found] == ["mine"]  # type: ignore[union-attr]
    assert call(running, "GET", "/api/users/nope/permissions")[0] == 404
    status, found = call(running, "GET", "/api/permissions")
    assert status == 200 and {(p["user"], p["vhost"]) for p in found} == {  # type: ignore[union-attr]
        ("guest", "/"),
        ("guest", "mine"),
        ("mgmt", "mine"),
    }
    expected = {"user": "mgmt", "vhost": "mine", "configure": ".*", "write": ".*", "read": ".*"}
    assert call(running, "GET", "/api/permissions/mine/mgmt") == (200, expected)
    assert call(running, "GET", "/api/permissions/mine/mon")[0] == 404
    # A narrower grant is enforced over AMQP at the next connection.
    narrow = {"configure": "^own\\.", "write": "", "read": ".*"}
    assert call(running, "PUT", "/api/permissions/mine/mgmt", narrow)[0] == 204
    with connect(running, "mgmt", "mgmt-pw", "mine") as conn:
        channel = conn.channel()
        channel.queue_declare("own.q")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="403"):
            channel.queue_declare("other.q")
    for body in ({"configure": "("}, {"configure": "(", "write": "", "read": ""}, {}):
        assert call(running, "PUT", "/api/permissions/mine/mon", body)[0] == 400
    full = {"configure": ".*", "write": ".*", "read": ".*"}
    assert call(running, "PUT", "/api/permissions/nope/mon", full)[0] == 400
    assert call(running, "PUT", "/api/permissions/mine/nope", full)[0] == 400
    assert call(running, "DELETE", "/api/permissions/mine/mgmt")[0] == 204
    assert call(running, "DELETE", "/api/permissions/mine/mgmt")[0] == 404
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        connect(running, "mgmt", "mgmt-pw", "mine")


def test_account_routes_need_administrator(running: RunningBroker) -> None:
    paths = [
        ("GET", "/api/users"),
        ("GET", "/api/users/guest"),
        ("PUT", "/api/users/x"),
        ("DELETE", "/api/users/guest"),
        ("GET", "/api/users/guest/permissions"),
        ("GET", "/api/users/without-permissions"),
        ("POST", "/api/users/bulk-delete"),
        ("GET", "/api/vhosts/mine/permissions"),
        ("GET", "/api/permissions"),
        ("GET", "/api/permissions/mine/mgmt"),
        ("PUT", "/api/permissions/mine/mgmt"),
        ("DELETE", "/api/permissions/mine/mgmt"),
    ]
    for method, path in paths:
        body = {"password": "p", "users": [], "configure": "", "write": "", "read": ""}
        for user in (MGMT, MONITOR):
            assert call(running, method, path, body, user=user)[0] == 403, (method, path)
        assert call(running, method, path, body, user=PLAIN)[0] == 401, (method, path)
    assert call(running, "GET", "/api/users/guest")[0] == 200  # nothing was changed


def test_overview_and_nodes(running: RunningBroker) -> None:
    with connect(running, "guest", "guest", "/") as conn:
        conn.channel().queue_declare("ov.q")
        status, overview = call(running, "GET", "/api/overview")
        assert status == 200 and isinstance(overview, dict)
        assert overview["product_name"] == "streamq"
        assert overview["object_totals"]["queues"] == 1  # type: ignore[index]
        assert overview["object_totals"]["connections"] == 1  # type: ignore[index]
        assert {"messages", "messages_ready", "messages_unacknowledged"} <= set(
            overview["queue_totals"]  # type: ignore[arg-type]
        )
        status, mine = call(running, "GET", "/api/overview", user=MGMT)
        assert mine["object_totals"]["queues"] == 0  # type: ignore[index]  # sees "mine" only
    status, nodes = call(running, "GET", "/api/nodes", user=MONITOR)
    assert status == 200 and isinstance(nodes, list) and len(nodes) == 1
    node = nodes[0]
    assert node["mem_used"] > 0 and node["disk_free"] > 0 and node["fd_used"] > 0
    assert node["mem_limit"] > 0 and node["disk_free_limit"] > 0 and node["uptime"] >= 0
    assert call(running, "GET", f"/api/nodes/{node['name']}")[0] == 200
    assert call(running, "GET", "/api/nodes/nope@host")[0] == 404
    assert call(running, "GET", "/api/nodes", user=MGMT)[0] == 403
    assert call(running, "GET", f"/api/nodes/{node['name']}", user=MGMT)[0] == 403


def test_aliveness_test(running: RunningBroker) -> None:
    assert call(running, "GET", "/api/aliveness-test/%2F") == (200, {"status": "ok"})
    assert call(running, "GET", "/api/aliveness-test/%2F") == (200, {"status": "ok"})
    assert call(running, "GET", "/api/aliveness-test/mine", user=MGMT) == (200, {"status": "ok"})
    assert call(running, "GET", "/api/aliveness-test/%2F", user=MGMT)[0] == 403
    assert call(running, "GET", "/api/aliveness-test/nope")[0] == 404
    assert call(running, "GET", "/api/aliveness-test/%2F", user=PLAIN)[0] == 401


def test_repeated_failed_logins_are_slowed(running: RunningBroker) -> None:
    elapsed = []
    for _ in range(auth.FAILURES_FREE + 2):
        start = time.monotonic()
        assert call(running, "GET", "/api/whoami", user=("guest", "wrong"))[0] == 401
        elapsed.append(time.monotonic() - start)
    fifth_delay = auth.DELAY_S_BASE * 2
    assert elapsed[-1] >= fifth_delay
    assert elapsed[-1] < fifth_delay + 2.0
    assert max(elapsed[: auth.FAILURES_FREE]) < auth.DELAY_S_BASE
    assert call(running, "GET", "/api/whoami")[0] == 200  # the right password still works


def test_openapi_is_served(running: RunningBroker) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", running.http_port, timeout=10)
    try:
        conn.request("GET", "/openapi.yaml")
        response = conn.getresponse()
        assert response.status == 200 and b"openapi: 3" in response.read()
    finally:
        conn.close()
    assert call(running, "GET", "/api/openapi.yaml", user=("guest", "wrong"))[0] == 401
