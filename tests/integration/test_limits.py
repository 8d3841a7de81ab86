"""Vhost and user limits end to end: set over the HTTP API, `streamq ctl` (online and with
--data-dir) and definitions, kept across a restart in accounts.json (version 2 only while
it holds limits), and met by real clients: pika over AMQP, rstream over the stream
protocol (counted, never refused). The wire answers are compared with RabbitMQ in
tests/differential/scenarios/limits.py; here the broker's own bookkeeping is tested: a
closed or dropped connection frees its slot, channels count across connections, a
lowered limit closes nothing."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from rstream import Producer

from tests.integration.conftest import PikaConnect, RunningBroker, broker_on, wait_until

WAIT_S = 10
CTL_TIMEOUT_S = 30
HOST = "127.0.0.1"
EVERYTHING = {"configure": ".*", "write": ".*", "read": ".*"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    running = RunningBroker(tmp_path / "data", stream_port=0)
    yield running
    running.stop()


def ok(broker: RunningBroker, method: str, path: str, body: object = None) -> object:
    status, found, _ = broker.http(method, path, body)
    assert status in (200, 201, 204), (method, path, status, found)
    return found


def user_on(broker: RunningBroker, user: str, vhost: str) -> None:
    ok(broker, "PUT", f"/api/users/{user}", {"password": user, "tags": ""})
    ok(broker, "PUT", f"/api/permissions/{vhost}/{user}", EVERYTHING)


def tracked(broker: RunningBroker, vhost: str) -> int:
    return broker.ask(lambda: broker.broker.tracking.count_in_vhost(vhost))


def test_a_closed_or_dropped_connection_frees_its_slot(
    broker: RunningBroker, pika_connect: PikaConnect
) -> None:
    ok(broker, "PUT", "/api/vhosts/v1", {})
    ok(broker, "PUT", "/api/vhost-limits/v1/max-connections", {"value": 1})
    first = pika_connect("v1")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError, match=r"connection limit \(1\)"):
        pika_connect("v1")
    first.close()
    wait_until(lambda: tracked(broker, "v1") == 0, "the closed connection to be forgotten")
    # A peer that vanishes without a close frees its slot too (not the fixture's: closed).
    second = pika.BlockingConnection(pika.ConnectionParameters(HOST, broker.amqp_port, "v1"))
    second._impl._transport._sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
    wait_until(lambda: tracked(broker, "v1") == 0, "the dropped connection to be forgotten")
    pika_connect("v1").channel().queue_declare("fits")


def test_a_user_s_channels_count_across_its_connections(
    broker: RunningBroker, pika_connect: PikaConnect
) -> None:
    user_on(broker, "u1", "%2F")
    ok(broker, "PUT", "/api/user-limits/u1/max-channels", {"value": 3})
    a, b = pika_connect(user="u1"), pika_connect(user="u1")
    kept = [a.channel(), a.channel(), b.channel()]
    with pytest.raises(
        pika.exceptions.ConnectionClosedByBroker, match="maximum allowed user limit of"
    ):
        b.channel()
    assert a.is_open and all(ch.is_open for ch in kept[:2])
    kept[0].close()  # one freed: the next open fits
    pika_connect(user="u1").channel().queue_declare("", exclusive=True)
    pika_connect().channel()  # guest has no limit


def test_a_lowered_limit_closes_nothing_and_applies_to_the_next(
    broker: RunningBroker, pika_connect: PikaConnect
) -> None:
    ok(broker, "PUT", "/api/vhosts/v2", {})
    conns = [pika_connect("v2") for _ in range(3)]
    channel = conns[0].channel()
    channel.queue_declare("a")
    channel.queue_declare("b")
    ok(broker, "PUT", "/api/vhost-limits/v2/max-connections", {"value": 1})
    ok(broker, "PUT", "/api/vhost-limits/v2/max-queues", {"value": 1})
    assert all(conn.is_open for conn in conns)
    channel.queue_declare("a", passive=True)  # both queues stay
    channel.queue_declare("b", passive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="queue limit in vhost 'v2'"):
        channel.queue_declare("c")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        pika_connect("v2")


async def test_stream_connections_count_but_are_never_refused(broker: RunningBroker) -> None:
    # As RabbitMQ 3.10 (checked by hand with its stream plugin; docs/compatibility.md).
    ok(broker, "PUT", "/api/vhosts/v3", {})
    ok(broker, "PUT", "/api/vhost-limits/v3/max-connections", {"value": 1})
    port = next(port for protocol, _, port in broker.listeners if protocol == "stream")
    producers = [Producer(HOST, port, vhost="v3", username="guest", password="guest")]
    producers.append(Producer(HOST, port, vhost="v3", username="guest", password="guest"))
    try:
        for producer in producers:
            await producer.start()  # the second is over the limit, and opens all the same
        assert tracked(broker, "v3") == 2  # counted before the broker answered each Open
        params = pika.ConnectionParameters(HOST, broker.amqp_port, "v3", socket_timeout=WAIT_S)
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError, match=r"limit \(1\)"):
            await asyncio.to_thread(pika.BlockingConnection, params)
        # The connection over the limit works. Last: rstream's create_stream closes the
        # producer's locator connection once it has no stream (a CI run that counted after
        # it met one connection).
        await producers[1].create_stream("s3")
        assert ok(broker, "GET", "/api/queues/v3/s3")
    finally:
        await asyncio.gather(*(producer.close() for producer in producers))
    wait_until(lambda: tracked(broker, "v3") == 0, "the stream connections to be forgotten")


def test_limits_survive_a_restart_in_a_version_2_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    accounts = data_dir / "definitions" / "accounts.json"
    with broker_on(data_dir) as broker:
        ok(broker, "PUT", "/api/vhosts/v4", {})
        user_on(broker, "u4", "v4")
        assert json.loads(accounts.read_text())["version"] == 1  # no limits: readable by all
        ok(broker, "PUT", "/api/vhost-limits/v4/max-queues", {"value": 7})
        ok(broker, "PUT", "/api/user-limits/u4/max-connections", {"value": 0})
    stored = json.loads(accounts.read_text())
    assert stored["version"] == 2
    assert {"name": "v4", "limits": {"max-queues": 7}} in stored["vhosts"]
    assert next(u for u in stored["users"] if u["name"] == "u4")["limits"] == {"max-connections": 0}
    with broker_on(data_dir) as broker:
        assert ok(broker, "GET", "/api/vhost-limits/v4") == [
            {"vhost": "v4", "value": {"max-queues": 7}}
        ]
        params = pika.ConnectionParameters(
            HOST, broker.amqp_port, "v4", pika.PlainCredentials("u4", "u4")
        )
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError, match="user connection"):
            pika.BlockingConnection(params)
        ok(broker, "DELETE", "/api/user-limits/u4/all")
        ok(broker, "DELETE", "/api/parameters/vhost-limits/v4/limits")
        pika.BlockingConnection(params).close()
    assert json.loads(accounts.read_text())["version"] == 1  # back to one older streamqs read


def test_deleting_a_vhost_or_user_drops_its_limits(broker: RunningBroker) -> None:
    ok(broker, "PUT", "/api/vhosts/v5", {})
    user_on(broker, "u5", "v5")
    ok(broker, "PUT", "/api/vhost-limits/v5/max-queues", {"value": 1})
    ok(broker, "PUT", "/api/user-limits/u5/max-channels", {"value": 1})
    ok(broker, "DELETE", "/api/vhosts/v5")
    ok(broker, "DELETE", "/api/users/u5")
    ok(broker, "PUT", "/api/vhosts/v5", {})
    user_on(broker, "u5", "v5")
    assert ok(broker, "GET", "/api/vhost-limits") == []
    assert ok(broker, "GET", "/api/user-limits") == []


def test_definitions_round_trip_limits(broker: RunningBroker, tmp_path: Path) -> None:
    ok(broker, "PUT", "/api/vhosts/v6", {})
    user_on(broker, "u6", "v6")
    ok(broker, "PUT", "/api/vhost-limits/v6/max-connections", {"value": 3})
    ok(broker, "PUT", "/api/user-limits/u6/max-channels", {"value": 8})
    exported = ok(broker, "GET", "/api/definitions")
    assert isinstance(exported, dict)
    assert {
        "value": {"max-connections": 3},
        "vhost": "v6",
        "component": "vhost-limits",
        "name": "limits",
    } in exported["parameters"]
    assert next(u for u in exported["users"] if u["name"] == "u6")["limits"] == {"max-channels": 8}
    with broker_on(tmp_path / "other") as other:
        ok(other, "POST", "/api/definitions", exported)
        assert ok(other, "GET", "/api/vhost-limits/v6") == [
            {"vhost": "v6", "value": {"max-connections": 3}}
        ]
        assert ok(other, "GET", "/api/user-limits/u6") == [
            {"user": "u6", "value": {"max-channels": 8}}
        ]


def test_an_import_over_max_queues_declares_none(broker: RunningBroker) -> None:
    ok(broker, "PUT", "/api/vhosts/v7", {})
    ok(broker, "PUT", "/api/vhost-limits/v7/max-queues", {"value": 1})
    queues = [{"name": name, "vhost": "v7", "durable": True} for name in ("a", "b")]
    status, answer, _ = broker.http("POST", "/api/definitions", {"queues": queues})
    assert status == 400, answer
    assert "Adding 2 queue(s)" in str(answer) and "Import aborted!" in str(answer)
    assert ok(broker, "GET", "/api/queues/v7") == []


def ctl(data_dir: Path | None, *args: str, uri: str | None = None) -> str:
    """`streamq ctl` as a process: offline on `data_dir`, or over HTTP at `uri`."""
    where = ["--data-dir", str(data_dir)] if data_dir is not None else ["--uri", str(uri)]
    done = subprocess.run(
        [sys.executable, "-m", "streamq", "ctl", *args, *where],
        capture_output=True,
        text=True,
        timeout=CTL_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_ctl_sets_lists_and_clears_limits_online_and_offline(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with broker_on(data_dir) as broker:
        uri = f"http://guest:guest@{HOST}:{broker.http_port}"
        user_on(broker, "u8", "%2F")
        ctl(None, "set_vhost_limits", '{"max-connections": 5, "max-queues": 2}', uri=uri)
        ctl(None, "set_user_limits", "u8", '{"max-channels": 4}', uri=uri)
        listed = json.loads(ctl(None, "list_vhost_limits", "--format", "json", uri=uri))
        assert listed == [{"vhost": "/", "limits": '{"max-connections": 5, "max-queues": 2}'}]
        users = json.loads(ctl(None, "list_user_limits", "--format", "json", uri=uri))
        assert users == [{"user": "u8", "limits": '{"max-channels": 4}'}]
        ctl(None, "clear_vhost_limits", uri=uri)
        assert ok(broker, "GET", "/api/vhost-limits") == []
        done = subprocess.run(
            [sys.executable, "-m", "streamq", "ctl", "set_user_limits", "u8", '{"max-x": 1}'],
            capture_output=True,
            text=True,
            timeout=CTL_TIMEOUT_S,
            check=False,
            env={"STREAMQ_CTL_URI": uri, "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 1 and "Unrecognised terms" in done.stderr, done.stderr
    # Offline, on the stopped broker's data directory.
    ctl(data_dir, "clear_user_limits", "u8", "max-channels")
    ctl(data_dir, "set_vhost_limits", "-p", "/", '{"max-queues": 0}')
    assert "max-queues" in ctl(data_dir, "list_vhost_limits", "--global")
    assert ctl(data_dir, "list_user_limits", "--format", "json") == "[]\n"
    with broker_on(data_dir) as broker:
        channel = pika.BlockingConnection(
            pika.ConnectionParameters(HOST, broker.amqp_port)
        ).channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match=r"\(0\) is reached"):
            channel.queue_declare("none")
