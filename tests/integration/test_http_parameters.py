"""Runtime parameters of shovels and federation upstreams, and the status of links, over
the management API of a real broker: RabbitMQ's statuses and JSON, its 400 "Validation
failed" for a bad value (and nothing changed), permissions, restart and definitions.

The status routes (/api/shovels, /api/federation-links) render what the links runtime
registers in `Broker.links`; `TestLink` below is a small real implementation of the
`Link` protocol registered from the test, so that the rendering and the pause, resume
and restart routes are tested whatever the runtime does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streamq.broker.accounts import AccountStore
from streamq.broker.links import link_key
from tests.integration.conftest import RunningBroker, broker_on

PASSWORD = "pw"
SHOVEL = {
    "src-uri": "amqp://127.0.0.1:1",
    "src-queue": "from",
    "dest-uri": "amqp://user:secret@127.0.0.1:2/%2f",
    "dest-queue": "to",
}
UPSTREAM = {"uri": "amqp://up:secret@127.0.0.1:3", "max-hops": 2}


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningBroker]:
    data_dir = tmp_path / "data"
    store = AccountStore.open(str(data_dir))
    store.add_user("maker", PASSWORD, ["policymaker"])
    store.set_permissions("maker", "/", ".*", ".*", ".*")
    store.add_user("outsider", PASSWORD, ["policymaker"])  # no permissions on "/"
    store.add_user("watcher", PASSWORD, ["management"])
    store.set_permissions("watcher", "/", ".*", ".*", ".*")
    broker = RunningBroker(data_dir)
    yield broker
    broker.stop()


def call(
    broker: RunningBroker, method: str, path: str, body: object = None, user: str = "guest"
) -> tuple[int, object]:
    password = "guest" if user == "guest" else PASSWORD
    status, parsed, _ = broker.http(method, path, body, user=user, password=password)
    return status, parsed


def put(broker: RunningBroker, component: str, name: str, value: object) -> tuple[int, object]:
    return call(broker, "PUT", f"/api/parameters/{component}/%2F/{name}", {"value": value})


def test_put_get_list_delete_as_rabbitmq(running: RunningBroker) -> None:
    assert put(running, "shovel", "s1", SHOVEL)[0] == 201
    assert put(running, "shovel", "s1", {**SHOVEL, "dest-queue": "other"})[0] == 204
    assert put(running, "federation-upstream", "up", UPSTREAM)[0] == 201
    assert put(running, "federation-upstream-set", "set", [{"upstream": "up"}])[0] == 201
    expected = {
        "value": {**SHOVEL, "dest-queue": "other"},
        "vhost": "/",
        "component": "shovel",
        "name": "s1",
    }
    assert call(running, "GET", "/api/parameters/shovel/%2F/s1") == (200, expected)
    assert call(running, "GET", "/api/parameters/shovel") == (200, [expected])
    assert call(running, "GET", "/api/parameters/shovel/%2F") == (200, [expected])
    status, everything = call(running, "GET", "/api/parameters")
    assert status == 200 and isinstance(everything, list)
    assert [(p["component"], p["name"]) for p in everything] == [
        ("federation-upstream", "up"),
        ("federation-upstream-set", "set"),
        ("shovel", "s1"),
    ]
    assert call(running, "GET", "/api/parameters/mqtt") == (200, [])
    assert call(running, "DELETE", "/api/parameters/shovel/%2F/s1")[0] == 204
    assert call(running, "DELETE", "/api/parameters/shovel/%2F/s1")[0] == 404
    assert call(running, "GET", "/api/parameters/shovel/%2F/s1")[0] == 404
    assert call(running, "DELETE", "/api/parameters/mqtt/%2F/s1")[0] == 404


@pytest.mark.parametrize(
    ("component", "value", "reason"),
    [
        ("shovel", {**SHOVEL, "src-prefetch-count": "many"}, "src-prefetch-count should be"),
        ("shovel", {**SHOVEL, "surprise": True}, "Unrecognised terms ['surprise'] in shovel"),
        ("shovel", {k: v for k, v in SHOVEL.items() if k != "src-queue"}, "Must specify"),
        ("shovel", {**SHOVEL, "src-exchange": "x"}, "Cannot specify 'src-exchange' and"),
        ("shovel", {**SHOVEL, "ack-mode": "eventually"}, "ack-mode should be one of"),
        ("shovel", {**SHOVEL, "src-uri": "amqp://h:port"}, "is not a valid URI"),
        ("shovel", "not an object", "should be a JSON object"),
        ("federation-upstream", {"uri": "amqp://h", "max-hops": "1"}, "max-hops should be"),
        ("federation-upstream", {"exchange": "x"}, 'Key "uri" not found'),
        ("federation-upstream-set", [{"upstream": 1}], "upstream should be a string"),
    ],
)
def test_a_bad_value_is_rabbitmqs_400_and_changes_nothing(
    running: RunningBroker, component: str, value: object, reason: str
) -> None:
    good: object = {"shovel": SHOVEL, "federation-upstream": UPSTREAM}.get(
        component, [{"upstream": "up"}]
    )
    assert put(running, component, "p", good)[0] == 201
    status, body = put(running, component, "p", value)
    assert status == 400
    assert isinstance(body, dict) and body["error"] == "bad_request"
    assert str(body["reason"]).startswith("Validation failed\n\n") and reason in body["reason"]
    assert str(body["reason"]).endswith("\n")
    assert "secret" not in str(body["reason"])
    assert call(running, "GET", f"/api/parameters/{component}/%2F/p")[1] == {
        "value": good,
        "vhost": "/",
        "component": component,
        "name": "p",
    }


def test_other_components_and_bodies(running: RunningBroker) -> None:
    status, body = put(running, "mqtt", "p", {"x": 1})
    assert status == 400 and isinstance(body, dict)
    assert body["reason"] == "Validation failed\n\ncomponent mqtt not found\n"  # RabbitMQ's
    assert call(running, "PUT", "/api/parameters/shovel/%2F/p", b"{nope")[0] == 400
    assert call(running, "PUT", "/api/parameters/shovel/nowhere/p", {"value": SHOVEL})[0] == 404
    assert call(running, "GET", "/api/parameters/shovel")[1] == []


def test_permissions_as_rabbitmq(running: RunningBroker) -> None:
    path = "/api/parameters/shovel/%2F/p"
    assert call(running, "PUT", path, {"value": SHOVEL}, user="maker")[0] == 201
    assert call(running, "GET", path, user="maker")[0] == 200
    assert call(running, "PUT", path, {"value": SHOVEL}, user="watcher")[0] == 403
    assert call(running, "GET", "/api/parameters", user="watcher")[0] == 403
    assert call(running, "PUT", path, {"value": SHOVEL}, user="outsider")[0] == 403
    assert call(running, "GET", "/api/parameters", user="outsider") == (200, [])
    # Operator policies stay the administrators'.
    policy = {"value": {"pattern": ".", "definition": {"max-length": 5}}}
    assert call(running, "PUT", "/api/parameters/operator_policy/%2F/op", policy, "maker")[0] == 403
    assert call(running, "DELETE", path, user="maker")[0] == 204


def test_parameters_survive_a_restart(tmp_path: Path) -> None:
    with broker_on(tmp_path / "data") as first:
        assert put(first, "shovel", "s1", SHOVEL)[0] == 201
        assert put(first, "federation-upstream", "up", UPSTREAM)[0] == 201
        assert put(first, "shovel", "gone", SHOVEL)[0] == 201
        assert call(first, "DELETE", "/api/parameters/shovel/%2F/gone")[0] == 204
    with broker_on(tmp_path / "data") as second:
        status, found = call(second, "GET", "/api/parameters")
        assert status == 200 and isinstance(found, list)
        assert [(p["component"], p["name"], p["value"]) for p in found] == [
            ("federation-upstream", "up", UPSTREAM),
            ("shovel", "s1", SHOVEL),
        ]


def test_definitions_carry_parameters(running: RunningBroker, tmp_path: Path) -> None:
    put(running, "shovel", "s1", SHOVEL)
    put(running, "federation-upstream", "up", UPSTREAM)
    put(running, "federation-upstream-set", "set", [{"upstream": "up", "max-hops": 3}])
    status, document = call(running, "GET", "/api/definitions")
    assert status == 200 and isinstance(document, dict)
    exported = document["parameters"]
    assert {"value": SHOVEL, "vhost": "/", "component": "shovel", "name": "s1"} in exported
    assert len(exported) == 3
    status, per_vhost = call(running, "GET", "/api/definitions/%2F")
    assert isinstance(per_vhost, dict) and len(per_vhost["parameters"]) == 3
    other = RunningBroker(tmp_path / "other")
    try:
        assert call(other, "POST", "/api/definitions", document)[0] == 204
        assert call(other, "POST", "/api/definitions", document)[0] == 204  # idempotent
        assert (
            call(other, "GET", "/api/parameters")[1] == call(running, "GET", "/api/parameters")[1]
        )
        bad = {
            "parameters": [
                {"value": {"uri": 5}, "vhost": "/", "component": "federation-upstream", "name": "x"}
            ]
        }
        status, body = call(other, "POST", "/api/definitions", bad)
        assert status == 400 and isinstance(body, dict) and "uri should be" in body["reason"]
        assert call(other, "GET", "/api/parameters/federation-upstream/%2F/x")[0] == 404
    finally:
        other.stop()


def test_policies_take_the_federation_keys(running: RunningBroker) -> None:
    body = {"pattern": "^fed\\.", "definition": {"federation-upstream-set": "all"}}
    assert call(running, "PUT", "/api/policies/%2F/fed", body)[0] == 201
    both = {
        "pattern": ".",
        "definition": {"federation-upstream": "up", "federation-upstream-set": "all"},
    }
    status, reply = call(running, "PUT", "/api/policies/%2F/both", both)
    assert status == 400 and "together" in str(reply)
    pattern = {"pattern": ".", "definition": {"federation-upstream-pattern": "^edge-"}}
    assert call(running, "PUT", "/api/policies/%2F/pattern", pattern)[0] == 201
    broken = {"pattern": ".", "definition": {"federation-upstream-pattern": "(["}}
    assert call(running, "PUT", "/api/policies/%2F/broken", broken)[0] == 400


# -- /api/shovels and /api/federation-links ---------------------------------------------


@dataclass
class TestLink:
    """A real `Link` (the protocol's whole surface), registered from the test."""

    __test__ = False  # not a test class for pytest

    kind: str
    vhost: str
    name: str
    state: str = "running"
    error: str = ""
    transferred: int = 0
    calls: list[str] = field(default_factory=list)

    def status(self) -> dict[str, object]:
        if self.kind == "shovel":
            return {
                "type": "dynamic",
                "state": self.state,
                "src_uri": "amqp://127.0.0.1:1",
                "src_queue": "from",
                "dest_uri": "amqp://user:********@127.0.0.1:2/%2f",
                "dest_queue": "to",
                "timestamp": "2024-01-01 00:00:00",
            }
        return {
            "exchange": "fed.x",
            "upstream": "up",
            "upstream_exchange": "fed.x",
            "type": "exchange",
            "status": self.state,
            "local_connection": "<direct>",
            "uri": "amqp://up:********@127.0.0.1:3",
            "timestamp": "2024-01-01 00:00:00",
        }

    def pause(self) -> None:
        self.calls.append("pause")
        self.state = "paused"

    def resume(self) -> None:
        self.calls.append("resume")
        self.state = "running"

    def restart(self) -> None:
        self.calls.append("restart")


def register(running: RunningBroker, link: TestLink) -> None:
    def add() -> None:
        assert running.broker is not None
        running.broker.links[link_key(link.kind, link.vhost, link.name)] = link

    running.ask(add)


def test_a_shovel_not_running_yet_is_starting(running: RunningBroker) -> None:
    assert put(running, "shovel", "pending", SHOVEL)[0] == 201
    status, shown = call(running, "GET", "/api/shovels/%2F/pending")
    assert status == 200 and isinstance(shown, dict)
    # Unless a links runtime registered it meanwhile (and failed to reach 127.0.0.1:1).
    assert shown["state"] in ("starting", "terminated")
    assert shown["transferred"] == 0 and shown["type"] == "dynamic"
    assert shown["dest_uri"] == "amqp://user:********@127.0.0.1:2/%2f"
    assert (shown["src_queue"], shown["dest_queue"]) == ("from", "to")
    assert call(running, "GET", "/api/shovels/vhost/%2F/pending")[1] == shown
    assert call(running, "GET", "/api/shovels/vhost/%2F/nothing")[0] == 404
    assert call(running, "DELETE", "/api/shovels/vhost/%2F/pending")[0] == 204
    assert call(running, "GET", "/api/parameters/shovel/%2F/pending")[0] == 404
    assert call(running, "DELETE", "/api/shovels/vhost/%2F/pending")[0] == 404


def test_shovel_status_and_actions(running: RunningBroker) -> None:
    link = TestLink("shovel", "/", "test-link", transferred=42)
    register(running, link)
    status, listed = call(running, "GET", "/api/shovels")
    assert status == 200 and isinstance(listed, list)
    shown = next(s for s in listed if s["name"] == "test-link")
    assert shown["state"] == "running" and shown["vhost"] == "/"
    assert shown["transferred"] == 42 and shown["message_count"] == 42
    assert shown["node"].startswith("streamq@") and shown["error"] == ""
    assert "secret" not in str(listed)
    assert call(running, "GET", "/api/shovels/%2F")[1] == listed
    path = "/api/shovels/vhost/%2F/test-link"
    assert call(running, "PUT", path + "/pause", user="watcher")[0] == 403
    assert call(running, "PUT", path + "/pause", user="maker")[0] == 204
    assert call(running, "GET", path)[1]["state"] == "paused"  # type: ignore[index]
    assert call(running, "PUT", "/api/shovels/%2F/test-link/resume")[0] == 204
    assert call(running, "DELETE", path + "/restart")[0] == 204
    assert running.ask(lambda: list(link.calls)) == ["pause", "resume", "restart"]
    assert call(running, "PUT", "/api/shovels/vhost/%2F/none/pause")[0] == 404
    assert call(running, "GET", "/api/shovels", user="outsider") == (200, [])


def test_federation_links_status(running: RunningBroker) -> None:
    link = TestLink("federation", "/", "fed.x up", state="error", error="connection refused")
    register(running, link)
    status, listed = call(running, "GET", "/api/federation-links")
    assert status == 200 and isinstance(listed, list) and len(listed) == 1
    shown = listed[0]
    assert (shown["status"], shown["error"]) == ("error", "connection refused")
    assert (shown["exchange"], shown["upstream"], shown["type"]) == ("fed.x", "up", "exchange")
    assert call(running, "GET", "/api/federation-links/%2F")[1] == listed
    assert call(running, "GET", "/api/federation-links/nowhere")[0] == 404
    assert call(running, "GET", "/api/federation-links", user="outsider") == (200, [])


def test_metrics_of_links(running: RunningBroker) -> None:
    register(running, TestLink("shovel", "/", "moving", transferred=7))
    register(running, TestLink("federation", "/", "fed.x up", state="paused", transferred=3))
    status, text, _ = running.http("GET", "/metrics")
    assert status == 200 and isinstance(text, str)
    lines = set(text.splitlines())
    assert "# TYPE streamq_shovel_state gauge" in lines
    assert 'streamq_shovel_state{vhost="/",name="moving",state="running"} 1' in lines
    assert 'streamq_shovel_state{vhost="/",name="moving",state="terminated"} 0' in lines
    assert 'streamq_shovel_transferred_total{vhost="/",name="moving"} 7' in lines
    assert 'streamq_federation_link_state{vhost="/",name="fed.x up",state="paused"} 1' in lines
    assert 'streamq_federation_link_transferred_total{vhost="/",name="fed.x up"} 3' in lines
