"""`streamq ctl` shovel and federation verbs against a running broker, over the real
management API: values from flags named after RabbitMQ's keys or whole as --value, the
broker's validation errors as one line, listings in both formats."""

from __future__ import annotations

import pytest

from tests.integration.conftest import RunningBroker
from tests.integration.test_ctl_http import Ctl


@pytest.fixture
def ctl(broker: RunningBroker, capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(broker, capsys)


def parameter(broker: RunningBroker, component: str, vhost: str, name: str) -> object:
    status, body, _ = broker.http("GET", f"/api/parameters/{component}/{vhost}/{name}")
    return body if status == 200 else status


def test_shovels_added_listed_and_deleted(ctl: Ctl, broker: RunningBroker) -> None:
    out = ctl.ok(
        "add_shovel",
        "s1",
        "--src-uri",
        "amqp://127.0.0.1:1",
        "--src-uri",
        "amqp://127.0.0.1:2",
        "--src-queue",
        "from",
        "--src-delete-after",
        "5",
        "--src-consumer-args",
        '{"x-stream-offset": "first"}',
        "--dest-uri",
        "amqp://u:secret@127.0.0.1:3",
        "--dest-exchange",
        "x",
        "--dest-add-forward-headers",
        "--ack-mode",
        "on-publish",
        "--reconnect-delay",
        "2.5",
    )
    assert out == 'Set shovel "s1" in vhost "/".\n'
    found = parameter(broker, "shovel", "%2F", "s1")
    assert isinstance(found, dict)
    assert found["value"] == {
        "src-uri": ["amqp://127.0.0.1:1", "amqp://127.0.0.1:2"],
        "src-queue": "from",
        "src-delete-after": 5,
        "src-consumer-args": {"x-stream-offset": "first"},
        "dest-uri": "amqp://u:secret@127.0.0.1:3",
        "dest-exchange": "x",
        "dest-add-forward-headers": True,
        "ack-mode": "on-publish",
        "reconnect-delay": 2.5,
    }
    listed = ctl.json("list_shovels")
    assert isinstance(listed, list) and [r["name"] for r in listed] == ["s1"]
    assert listed[0]["dest_uri"] == "amqp://u:********@127.0.0.1:3"
    table = ctl.ok("list_shovels", "-p", "/")
    assert table.splitlines()[0].split() == [
        "vhost",
        "name",
        "state",
        "transferred",
        "src_uri",
        "dest_uri",
        "error",
    ]
    assert "secret" not in table
    assert ctl.ok("delete_shovel", "s1") == 'Deleted shovel "s1" in vhost "/".\n'
    assert parameter(broker, "shovel", "%2F", "s1") == 404
    assert ctl.fails("delete_shovel", "s1").startswith("404")


def test_a_shovel_from_a_whole_value_with_flags_on_top(ctl: Ctl, broker: RunningBroker) -> None:
    value = '{"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}'
    ctl.ok("add_shovel", "s2", "--value", value, "--dest-queue", "c")
    found = parameter(broker, "shovel", "%2F", "s2")
    assert isinstance(found, dict) and found["value"]["dest-queue"] == "c"  # type: ignore[index]


def test_bad_shovels_are_one_line_and_change_nothing(ctl: Ctl, broker: RunningBroker) -> None:
    error = ctl.fails("add_shovel", "bad", "--src-uri", "amqp://", "--dest-uri", "amqp://")
    assert "Validation failed" in error and "Must specify 'src-exchange' or 'src-queue'" in error
    assert "not JSON" in ctl.fails("add_shovel", "bad", "--value", "{")
    assert "must be a JSON object" in ctl.fails("add_shovel", "bad", "--value", "[1]")
    with pytest.raises(SystemExit) as usage:  # argparse's usage error
        ctl("add_shovel", "bad", "--ack-mode", "sometimes")
    assert usage.value.code == 2
    assert parameter(broker, "shovel", "%2F", "bad") == 404


def test_pause_resume_restart_need_a_running_shovel(ctl: Ctl) -> None:
    ctl.ok(
        "add_shovel",
        "s3",
        "--value",
        '{"src-uri": "amqp://127.0.0.1:1", "src-queue": "a", "dest-uri": "amqp://127.0.0.1:1"}',
    )
    for verb in ("pause_shovel", "resume_shovel", "restart_shovel"):
        status, out, err = ctl(verb, "missing")
        assert status == 1 and "404" in err, (verb, out, err)


def test_federation_upstreams_and_links(ctl: Ctl, broker: RunningBroker) -> None:
    out = ctl.ok(
        "add_federation_upstream",
        "up",
        "--upstream-uri",
        "amqp://127.0.0.1:1",
        "--exchange",
        "x",
        "--max-hops",
        "2",
        "--trust-user-id",
        "-p",
        "/",
    )
    assert out == 'Set federation upstream "up" in vhost "/".\n'
    found = parameter(broker, "federation-upstream", "%2F", "up")
    assert isinstance(found, dict)
    assert found["value"] == {
        "uri": "amqp://127.0.0.1:1",
        "exchange": "x",
        "max-hops": 2,
        "trust-user-id": True,
    }
    listed = ctl.json("list_federation_upstreams")
    assert listed == [{"vhost": "/", "name": "up", "value": found["value"]}]
    assert isinstance(ctl.json("list_federation_links"), list)
    assert "max-hops should be a non-negative integer" in ctl.fails(
        "add_federation_upstream", "up", "--upstream-uri", "amqp://h", "--max-hops", "-1"
    )
    assert ctl.ok("delete_federation_upstream", "up").startswith("Deleted federation upstream")
    assert parameter(broker, "federation-upstream", "%2F", "up") == 404
