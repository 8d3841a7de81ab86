"""Data directories written by earlier streamq versions open with everything they held.

Each fixture in tests/upgrade/data (`<name>-<variant>.tar.gz` and its manifest
`<name>-<variant>.json`, made by tools/make_datadir_fixture.py from a commit) is unpacked
into a temporary directory and served by today's `streamq serve`; real clients (pika, the
HTTP API, rstream) then check what the manifest lists: users log in, vhosts, permissions
and topic permissions (enforced), policies and operator policies (applied to their
queues), shovel and federation parameters, exchanges and bindings, every queue's messages
in order with their redelivered flags, priorities and x-death, delayed messages delivered
once due and held until then, streams read from the first record, tracked offsets
(QueryOffset) and publisher sequences (QueryPublisherSequence)."""

from __future__ import annotations

import asyncio
import base64
import calendar
import http.client
import json
import re
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pika.exceptions
import pytest
from rstream import (
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
)

from tests.integration.broker_process import BrokerProcess

DATA = Path(__file__).parent / "data"
MANIFESTS = sorted(DATA.glob("*.json"))
HOST = "127.0.0.1"
TIMEOUT_S = 10
DELAY_SLACK_MS = 60_000  # a delayed message due this long after now must still be held
GUEST = ("guest", "guest")
STREAM_PORT = re.compile(rb" stream=127\.0\.0\.1:(\d+)")

TTL_MARGIN_S = 120.0  # this close to a TTL's end, a message may or may not have expired


class Restored:
    """Today's broker serving a fixture's unpacked data directory."""

    def __init__(self, manifest: dict[str, Any], broker: BrokerProcess) -> None:
        self.manifest = manifest
        self.broker = broker
        match = STREAM_PORT.search(broker.stderr)
        assert match is not None, broker.stderr
        self.stream_port = int(match[1])

    def http(self, method: str, path: str, user: tuple[str, str] = GUEST) -> tuple[int, Any]:
        connection = http.client.HTTPConnection(HOST, self.broker.http_port, timeout=TIMEOUT_S)
        auth = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
        try:
            connection.request(method, path, headers={"Authorization": f"Basic {auth}"})
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        return response.status, (json.loads(raw) if raw.strip() else None)

    def get(self, path: str) -> Any:
        status, body = self.http("GET", path)
        assert status == 200, f"GET {path}: {status} {body}"
        return body

    def amqp(self, vhost: str = "/", user: tuple[str, str] = GUEST) -> Any:
        parameters = pika.ConnectionParameters(
            HOST,
            self.broker.amqp_port,
            vhost,
            pika.PlainCredentials(*user),
            blocked_connection_timeout=TIMEOUT_S,
            socket_timeout=TIMEOUT_S,
        )
        return pika.BlockingConnection(parameters)


def q(name: str) -> str:
    return quote(name, safe="")


def password(manifest: dict[str, Any], user: str) -> tuple[str, str]:
    return user, next(u["password"] for u in manifest["users"] if u["name"] == user)


@pytest.fixture(scope="module", params=MANIFESTS, ids=[m.stem for m in MANIFESTS])
def restored(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Restored]:
    manifest_path: Path = request.param
    manifest = json.loads(manifest_path.read_text())
    where = tmp_path_factory.mktemp(manifest_path.stem)
    with tarfile.open(manifest_path.with_suffix(".tar.gz")) as tar:
        tar.extractall(where, filter="data")
    broker = BrokerProcess(where / "data")
    try:
        yield Restored(manifest, broker)
    finally:
        code = broker.stop()
        assert code == 0, broker.stderr[-4000:]


def test_there_is_a_fixture() -> None:
    """At least the one written from the main of 2026-12-05 (issue 34)."""
    assert MANIFESTS, "no fixture in tests/upgrade/data"
    for manifest in MANIFESTS:
        assert manifest.with_suffix(".tar.gz").exists(), manifest


def test_users_vhosts_and_permissions(restored: Restored) -> None:
    manifest = restored.manifest
    users = {u["name"]: u for u in restored.get("/api/users")}
    for user in manifest["users"]:
        assert sorted(users[user["name"]]["tags"]) == sorted(user["tags"]), user
    assert {v["name"] for v in restored.get("/api/vhosts")} >= set(manifest["vhosts"])
    for p in manifest["permissions"]:
        got = restored.get(f"/api/permissions/{q(p['vhost'])}/{q(p['user'])}")
        assert {k: got[k] for k in ("configure", "write", "read")} == {
            k: p[k] for k in ("configure", "write", "read")
        }
        # Each user logs in with the password it was given, where it has permissions.
        restored.amqp(p["vhost"], password(manifest, p["user"])).close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        restored.amqp("/", (manifest["users"][0]["name"], "not-the-password"))


def test_topic_permissions_are_enforced(restored: Restored) -> None:
    manifest = restored.manifest
    for t in manifest["topic_permissions"]:
        got = restored.get(f"/api/topic-permissions/{q(t['vhost'])}/{q(t['user'])}")
        assert [(g["exchange"], g["write"], g["read"]) for g in got] == [
            (t["exchange"], t["write"], t["read"])
        ]
    # carol writes to amq.topic only with keys starting "carol."
    connection = restored.amqp("/", password(manifest, "carol"))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("amq.topic", "carol.allowed", b"x")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.basic_publish("amq.topic", "someone.else", b"x")
        assert refused.value.reply_code == 403
    finally:
        connection.close()


def test_policies_and_operator_policies_apply(restored: Restored) -> None:
    manifest = restored.manifest
    for kind, field in (("policies", "policy"), ("operator_policies", "operator_policy")):
        for p in manifest[kind]:
            path = f"/api/{kind.replace('_', '-')}/{q(p['vhost'])}/{q(p['name'])}"
            got = restored.get(path)
            assert got["definition"] == p["definition"], got
            assert (got["pattern"], got["apply-to"], got["priority"]) == (
                p["pattern"],
                p["apply-to"],
                p["priority"],
            )
            queue = restored.get(f"/api/queues/{q(p['vhost'])}/{q(p['queue'])}")
            assert queue[field] == p["name"], queue


def test_shovel_and_federation_parameters(restored: Restored) -> None:
    for m in restored.manifest["parameters"]:
        got = restored.get(f"/api/parameters/{m['component']}/{q(m['vhost'])}/{q(m['name'])}")
        assert got["value"] == m["value"], got


def test_exchanges_and_bindings(restored: Restored) -> None:
    manifest = restored.manifest
    for e in manifest["exchanges"]:
        got = restored.get(f"/api/exchanges/{q(e['vhost'])}/{q(e['name'])}")
        assert (got["type"], got["durable"], got["arguments"]) == (e["type"], True, e["arguments"])
    for b in manifest["bindings"]:
        listed = restored.get(f"/api/bindings/{q(b['vhost'])}")
        keys = ("source", "destination", "destination_type", "routing_key", "arguments")
        assert {k: b[k] for k in keys} in [{k: g[k] for k in keys} for g in listed], b


def message_ttl_ms(manifest: dict[str, Any], queue: dict[str, Any]) -> int | None:
    """The queue's message TTL: its argument, else the lowest of the policies that match
    it in the manifest."""
    arguments = queue.get("arguments") or {}
    if "x-message-ttl" in arguments:
        return int(arguments["x-message-ttl"])
    ttls = [
        int(policy["definition"]["message-ttl"])
        for policy in manifest["policies"]
        if policy["vhost"] == queue["vhost"]
        and "message-ttl" in policy["definition"]
        and re.match(policy["pattern"], queue["name"])
    ]
    return min(ttls) if ttls else None


def ttl_state(manifest: dict[str, Any], queue: dict[str, Any]) -> str:
    """ "kept" if the queue's messages are still within their TTL, "expired" if the TTL has
    run out since the fixture was made (the wall clock moves on: an upgrade test run a
    day later finds them expired, as RabbitMQ would), "either" near the boundary."""
    ttl = message_ttl_ms(manifest, queue)
    if ttl is None:
        return "kept"
    made = calendar.timegm(time.strptime(manifest["made_at"], "%Y-%m-%dT%H:%M:%SZ"))
    left_s = made + ttl / 1000 - time.time()
    if abs(left_s) < TTL_MARGIN_S:
        return "either"
    return "kept" if left_s > 0 else "expired"


def test_queues_hold_their_messages(restored: Restored) -> None:
    """In order, with the redelivered flag of messages delivered before the stop, the
    priorities' order, x-death of dead letters; nothing more, but for the messages whose
    TTL has run out since the fixture was made: gone from their queue, and dead-lettered
    (x-death reason `expired`) to the end of another."""
    manifest = restored.manifest
    expired_bodies: set[str] = set()
    states = {(q["vhost"], q["name"]): ttl_state(manifest, q) for q in manifest["queues"]}
    for expected in manifest["queues"]:
        if states[expected["vhost"], expected["name"]] != "kept":
            expired_bodies.update(m["body"] for m in expected["messages"])
    for expected in manifest["queues"]:
        state = states[expected["vhost"], expected["name"]]
        connection = restored.amqp(expected["vhost"])
        try:
            channel = connection.channel()
            if state == "kept":
                check_messages(channel, expected)
            rest = []
            while (got := channel.basic_get(expected["name"]))[0] is not None:
                rest.append(got)
            for _method, properties, body in rest:
                own = {m["body"] for m in expected["messages"]}
                if state == "either" and body.decode() in own:
                    continue
                deaths = (properties.headers or {}).get("x-death") or [{}]
                assert body.decode() in expired_bodies, (expected["name"], body)
                assert deaths[0].get("reason") == "expired", (expected["name"], deaths)
        finally:
            connection.close()


def check_messages(channel: Any, expected: dict[str, Any]) -> None:
    got = [channel.basic_get(expected["name"]) for _ in expected["messages"]]
    assert all(g[0] is not None for g in got), (expected, got)
    assert [g[2].decode() for g in got] == [m["body"] for m in expected["messages"]]
    flags = [g[0].redelivered for g in got]
    assert flags == expected.get("redelivered", [False] * len(got)), expected
    if "priorities" in expected:
        assert [g[1].priority for g in got] == expected["priorities"]
    if "x_death_queue" in expected:
        deaths = got[0][1].headers["x-death"]
        assert deaths[0]["queue"] == expected["x_death_queue"], deaths


def test_delayed_messages_come_when_due(restored: Restored) -> None:
    """Those due by now arrive (a SIGKILL may deliver one twice: at least once); those due
    well after now are still held."""
    now_ms = time.time() * 1000
    for expected in restored.manifest["delayed"]:
        assert expected["due_ms"] <= now_ms or expected["due_ms"] > now_ms + DELAY_SLACK_MS
    due = [d for d in restored.manifest["delayed"] if d["due_ms"] <= now_ms]
    held = [d for d in restored.manifest["delayed"] if d["due_ms"] > now_ms]
    connection = restored.amqp()
    try:
        channel = connection.channel()
        bodies: set[str] = set()
        deadline = time.monotonic() + TIMEOUT_S
        while not {d["body"] for d in due} <= bodies:
            assert time.monotonic() < deadline, f"due delayed messages missing: {bodies}"
            method, _, body = channel.basic_get(due[0]["queue"], auto_ack=True)
            if method is None:
                connection.sleep(0.05)
            else:
                bodies.add(body.decode())
        assert not {d["body"] for d in held} & bodies
        for h in held:
            assert channel.basic_get(h["queue"])[0] is None
    finally:
        connection.close()


async def test_streams_records_offsets_and_publishers(restored: Restored) -> None:
    for expected in restored.manifest["streams"]:
        assert expected["vhost"] == "/"
        consumer = Consumer(HOST, restored.stream_port, username="guest", password="guest")
        await consumer.start()
        try:
            got = await read_from_first(consumer, expected["name"], len(expected["records"]))
            assert got == expected["records"]
            for reference, offset in expected["offsets"].items():
                assert await consumer.query_offset(expected["name"], reference) == offset
        finally:
            await consumer.close()
        producer = Producer(HOST, restored.stream_port, username="guest", password="guest")
        await producer.start()
        try:
            client = await producer.default_client
            for reference, sequence in expected["publishers"].items():
                got_sequence = await client.query_publisher_sequence(expected["name"], reference)
                assert got_sequence == sequence, reference
        finally:
            await producer.close()


async def read_from_first(consumer: Consumer, stream: str, count: int) -> list[str]:
    """The bodies of the first `count` records of `stream` (more may follow)."""
    got: list[str] = []
    enough = asyncio.Event()

    async def on_message(message: Any, context: MessageContext) -> None:
        got.append(bytes(message.body).decode())
        if len(got) >= count:
            enough.set()

    first = ConsumerOffsetSpecification(OffsetType.FIRST, None)
    await consumer.subscribe(stream, on_message, decoder=amqp_decoder, offset_specification=first)
    await asyncio.wait_for(enough.wait(), TIMEOUT_S)
    return got[:count]
