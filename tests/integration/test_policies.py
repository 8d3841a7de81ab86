"""Policies through RabbitMQ's management API paths, on a real broker: validation,
authorization, priority, retention applied to live streams at once, the stricter of
argument and policy, alternate exchanges, and persistence across a restart."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from streamq.broker.accounts import AccountStore
from tests.integration.conftest import RunningBroker, broker_on

TIMEOUT_S = 10
SMALL_STREAM = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}


def call(
    broker: RunningBroker,
    method: str,
    path: str,
    body: object = None,
    user: str = "guest",
    password: str = "guest",
) -> tuple[int, object]:
    status, parsed, _ = broker.http(method, path, body, user=user, password=password)
    return status, parsed


@pytest.fixture
def policy_broker(tmp_path: Path) -> Iterator[RunningBroker]:
    data_dir = tmp_path / "data"
    store = AccountStore.open(str(data_dir))
    store.add_user("viewer", "pw", ["management"])
    store.set_permissions("viewer", "/", ".*", ".*", ".*")
    running = RunningBroker(data_dir)
    yield running
    running.stop()


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def first_offset(channel: pika.adapters.blocking_connection.BlockingChannel, name: str) -> int:
    channel.basic_qos(prefetch_count=1)
    for method, properties, _ in channel.consume(
        name, arguments={"x-stream-offset": "first"}, inactivity_timeout=TIMEOUT_S
    ):
        assert method is not None
        channel.cancel()
        return int(properties.headers["x-stream-offset"])
    raise AssertionError("unreachable")


def test_put_get_list_delete(policy_broker: RunningBroker) -> None:
    body = {"pattern": "^events", "definition": {"max-age": "7D"}, "apply-to": "streams"}
    assert call(policy_broker, "PUT", "/api/policies/%2F/keep-week", body) == (201, None)
    assert call(policy_broker, "PUT", "/api/policies/%2F/keep-week", body)[0] == 204
    status, got = call(policy_broker, "GET", "/api/policies/%2F/keep-week")
    assert status == 200
    assert got == {
        "vhost": "/",
        "name": "keep-week",
        "pattern": "^events",
        "apply-to": "streams",
        "definition": {"max-age": "7D"},
        "priority": 0,
    }
    assert [p["name"] for p in call(policy_broker, "GET", "/api/policies")[1]] == ["keep-week"]
    assert call(policy_broker, "DELETE", "/api/policies/%2F/keep-week")[0] == 204
    assert call(policy_broker, "DELETE", "/api/policies/%2F/keep-week")[0] == 404
    assert call(policy_broker, "GET", "/api/policies/%2F")[1] == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"pattern": "(", "definition": {"max-length": 1}}, "not a valid regular expression"),
        ({"pattern": ".*", "definition": {"max-length": -1}}, "non-negative integer"),
        ({"pattern": ".*", "definition": {"max-age": "7 days"}}, "'max-age' must match"),
        ({"pattern": ".*", "definition": {"colour": "red"}}, "unknown or unsupported"),
        ({"pattern": ".*", "definition": {"max-length": 1}, "apply-to": "x"}, "'apply-to'"),
        ({"pattern": ".*"}, "'definition'"),
    ],
)
def test_bad_policies_are_400_with_a_reason(
    policy_broker: RunningBroker, body: dict, reason: str
) -> None:
    status, got = call(policy_broker, "PUT", "/api/policies/%2F/bad", body)
    assert status == 400
    assert isinstance(got, dict) and reason in str(got["reason"])


def test_credentials_and_tags(policy_broker: RunningBroker) -> None:
    assert call(policy_broker, "GET", "/api/policies", password="wrong")[0] == 401
    assert call(policy_broker, "GET", "/api/policies", user="viewer", password="pw")[0] == 403
    assert call(policy_broker, "GET", "/api/policies/nowhere")[0] == 404
    assert call(policy_broker, "GET", "/api/unknown")[0] == 404


def test_a_policy_applies_to_a_live_stream_at_once_and_survives_restart(
    policy_broker: RunningBroker,
) -> None:
    conn = connect(policy_broker)
    channel = conn.channel()
    channel.queue_declare("events.orders", durable=True, arguments=SMALL_STREAM)
    channel.confirm_delivery()
    for n in range(200):
        channel.basic_publish("", "events.orders", f"{n:04d}".encode() + b"." * 100)
    assert first_offset(conn.channel(), "events.orders") == 0
    low = {"pattern": "^events", "definition": {"max-length": 20}, "priority": 1}
    high = {"pattern": "^events\\.", "definition": {"max-length": 100}, "priority": 5}
    assert call(policy_broker, "PUT", "/api/policies/%2F/low", low)[0] == 201
    after_low = first_offset(conn.channel(), "events.orders")
    assert after_low > 150  # applied at once, without a publish
    conn.close()
    policy_broker.stop()
    with broker_on(policy_broker.data_dir) as restarted:
        assert call(restarted, "GET", "/api/policies/%2F/low")[0] == 200
        # the higher priority policy wins: max-length 100 keeps what max-length 20 kept
        assert call(restarted, "PUT", "/api/policies/%2F/high", high)[0] == 201
        conn = connect(restarted)
        assert first_offset(conn.channel(), "events.orders") == after_low
        conn.close()


def test_an_alternate_exchange_by_policy(policy_broker: RunningBroker) -> None:
    conn = connect(policy_broker)
    channel = conn.channel()
    channel.exchange_declare("orders", "direct")
    channel.exchange_declare("unrouted", "fanout")
    channel.queue_declare("lost-and-found")
    channel.queue_bind("lost-and-found", "unrouted")
    body = {"pattern": "^orders$", "definition": {"alternate-exchange": "unrouted"}}
    assert call(policy_broker, "PUT", "/api/policies/%2F/ae", body)[0] == 201
    channel.basic_publish("orders", "nobody", b"stray")
    method, _, got = channel.basic_get("lost-and-found", auto_ack=True)
    assert method is not None and got == b"stray"
    conn.close()


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamq", "ctl", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_ctl_sets_lists_and_clears_policies_of_a_running_broker(
    policy_broker: RunningBroker,
) -> None:
    uri = f"--uri=http://guest:guest@127.0.0.1:{policy_broker.http_port}"
    done = ctl(
        "set_policy",
        uri,
        "--priority",
        "3",
        "--apply-to",
        "streams",
        "cap",
        "^s",
        '{"max-length": 5}',
    )
    assert done.returncode == 0, done.stderr
    listed = ctl("list_policies", uri)
    assert listed.stdout.splitlines() == [  # an aligned table (docs/ctl.md)
        "vhost  name  pattern  apply-to  definition         priority",
        '/      cap   ^s       streams   {"max-length": 5}         3',
    ]
    assert json.loads(ctl("list_policies", uri, "--json").stdout)[0]["name"] == "cap"
    bad = ctl("set_policy", uri, "cap", "^s", '{"max-length": "five"}')
    assert bad.returncode == 1
    assert bad.stderr.strip() == "streamq ctl: 400: 'max-length' must be a non-negative integer"
    assert ctl("clear_policy", uri, "cap").returncode == 0
    gone = ctl("clear_policy", uri, "cap")
    assert (gone.returncode, gone.stderr.strip()) == (1, "streamq ctl: 404: Not Found")


def test_ctl_without_a_broker_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = ctl("list_policies", f"--uri=http://guest:guest@127.0.0.1:{port}")
    assert done.returncode == 69  # EX_UNAVAILABLE, as rabbitmqctl (docs/ctl.md)
    assert done.stderr.strip() == f"streamq ctl: no broker answers at 127.0.0.1:{port}"
