"""Management API fields that report live state, as rabbitmqadmin and the web UI read them:
consumers (`active`, `activity_status` on a single-active-consumer queue), the queue's
`single_active_consumer_tag` and `exclusive_consumer_tag`, channels (prefetch, confirm
and transaction counts, unacked and unconfirmed messages, state), connections and nodes.

RabbitMQ's management database learns most of these from statistics that its channels,
queues and consumers emit every `collect_statistics_interval` (5 s), so each reading is
polled until it shows the state the clients just made (`settled`), within a bound; what
is recorded is the last reading, so a broker that never gets there records what it
shows instead, and the scenario differs. Readings are filtered to this scenario's
queues and its own connection (named by `connection_name`), as the RabbitMQ under test
is shared by every scenario.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pika

from tests.differential.harness import Session, scenario

V = "%2F"
SETTLE_TIMEOUT_S = 15.0  # three of RabbitMQ's default statistics intervals (peers.py: 1 s)
POLL_S = 0.1
SAC = {"x-single-active-consumer": True}
CONSUMER_FIELDS = (
    "consumer_tag",
    "active",
    "activity_status",
    "ack_required",
    "exclusive",
    "prefetch_count",
    "arguments",
)
CHANNEL_FIELDS = (
    "number",
    "user",
    "vhost",
    "state",
    "transactional",
    "confirm",
    "consumer_count",
    "prefetch_count",
    "global_prefetch_count",
    "messages_unacknowledged",
    "messages_unconfirmed",
    "messages_uncommitted",
    "acks_uncommitted",
)
# A new queue's counts come in a later report of RabbitMQ's than its state and consumers
# (null until then: a run under load saw them null with both consumers already shown).
MESSAGE_COUNTS = ("messages", "messages_ready", "messages_unacknowledged")
QUEUE_FIELDS = (
    "name",
    "type",
    "state",
    "consumers",
    "messages",
    "messages_ready",
    "messages_unacknowledged",
    "single_active_consumer_tag",
    "exclusive_consumer_tag",
)
CONNECTION_FIELDS = (
    "user",
    "vhost",
    "protocol",
    "state",
    "channels",
    "type",
    "ssl",
    "auth_mechanism",
    "frame_max",
    "timeout",
)
# Node figures rabbitmqadmin (`list nodes`: name, type, mem_used) and monitoring read;
# `proc_total` is left out on purpose (docs/management.md: streamq has no such limit).
NODE_FIGURES = (
    "mem_used",
    "mem_limit",
    "fd_used",
    "fd_total",
    "sockets_used",
    "sockets_total",
    "proc_used",
    "run_queue",
    "processors",
    "uptime",
    "disk_free",
    "disk_free_limit",
)


def settled(
    s: Session,
    path: str,
    pick: Callable[[Any], Any],
    done: Callable[[Any], bool],
    label: str | None = None,
) -> None:
    """Polls GET `path` until `done(pick(body))`, at most SETTLE_TIMEOUT_S; records
    `label` (the path by default: a connection's name differs between brokers) and the
    last `pick(body)` (None for a status other than 200). `done` must tell the state
    awaited from the one before it, as RabbitMQ may still show the earlier one."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        code, body = s.http("GET", path)
        value = pick(body) if code == 200 else None
        if (value is not None and done(value)) or time.monotonic() > deadline:
            s.record("GET", label or path, value)
            return
        time.sleep(POLL_S)


def _consumers(queues: set[str]) -> Callable[[Any], Any]:
    def pick(body: Any) -> Any:
        found = [c for c in body if c.get("queue", {}).get("name") in queues]
        return sorted(
            ({"queue": c["queue"]["name"]} | {f: c.get(f) for f in CONSUMER_FIELDS} for c in found),
            key=lambda c: c["consumer_tag"],
        )

    return pick


def _fields(names: tuple[str, ...]) -> Callable[[Any], Any]:
    return lambda body: {n: body.get(n) for n in names}


def _queue_fields(body: Any) -> Any:
    """QUEUE_FIELDS of a queue, or None while RabbitMQ shows only some of its figures
    (its message counts and its state and consumers come in different reports)."""
    fields = {n: body.get(n) for n in QUEUE_FIELDS}
    reported = (fields[n] is not None for n in ("state", *MESSAGE_COUNTS))
    return fields if all(reported) else None


def _named(s: Session, base: str) -> pika.BlockingConnection:
    """A pika connection whose `connection_name` finds it in the API."""
    return s.pika(client_properties={"connection_name": s.name(base)})


def _connection_path(s: Session, base: str) -> str:
    """/api/connections/{name} of the connection named `s.name(base)`, once listed."""
    wanted = s.name(base)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        code, body = s.http("GET", "/api/connections")
        for found in body if code == 200 else []:
            if found.get("client_properties", {}).get("connection_name") == wanted:
                return "/api/connections/" + quote(found["name"], safe="")
        time.sleep(POLL_S)
    return "/api/connections/missing"


def _channel(number: int) -> Callable[[Any], Any]:
    def pick(body: Any) -> Any:
        found = [c for c in body if c.get("number") == number]
        return {f: found[0].get(f) for f in CHANNEL_FIELDS} if found else None

    return pick


@scenario("http fields: consumers of a single-active-consumer queue, then the active cancels")
def _single_active(s: Session) -> None:
    sac, plain = s.name("sac"), s.name("plain")
    conn = _named(s, "conn")
    first, second = conn.channel(), conn.channel()
    first.queue_declare(sac, arguments=SAC)
    first.queue_declare(plain)
    first.basic_consume(sac, lambda *a: None, consumer_tag="c1")
    second.basic_consume(sac, lambda *a: None, consumer_tag="c2")
    second.basic_consume(plain, lambda *a: None, consumer_tag="c3", exclusive=True)
    pick = _consumers({sac, plain})
    for path in ("/api/consumers", f"/api/consumers/{V}"):
        settled(s, path, pick, lambda found: len(found) == 3)
    settled(
        s,
        f"/api/queues/{V}/{sac}",
        _queue_fields,
        lambda q: q["consumers"] == 2 and q["single_active_consumer_tag"] == "c1",
    )
    settled(
        s,
        f"/api/queues/{V}/{plain}",
        _queue_fields,
        lambda q: q["consumers"] == 1 and q["exclusive_consumer_tag"] == "c3",
    )
    settled(
        s,
        f"/api/queues/{V}/{sac}",
        lambda q: pick(q.get("consumer_details", [])),
        lambda found: len(found) == 2,
    )
    # A channel's own page lists its consumers too (the list of channels does not).
    channel = _connection_path(s, "conn").replace("/connections/", "/channels/") + "%20%282%29"
    settled(
        s,
        channel,
        lambda c: pick(c.get("consumer_details", [])),
        lambda found: len(found) == 2,
        "the second channel",
    )
    first.basic_cancel("c1")
    settled(
        s,
        "/api/consumers",
        pick,
        lambda found: [c["activity_status"] for c in found] == ["single_active", "up"],
    )
    settled(
        s,
        f"/api/queues/{V}/{sac}",
        _queue_fields,
        lambda q: q["single_active_consumer_tag"] != "c1",
    )


@scenario("http fields: a transaction's uncommitted publishes and acks, commit, rollback")
def _transaction(s: Session) -> None:
    q = s.name()
    conn = _named(s, "conn")
    plain = conn.channel()
    plain.queue_declare(q)
    for _ in range(3):
        plain.basic_publish("", q, b"before")
    tx = conn.channel()
    tx.tx_select()
    tags = []
    for _ in range(3):
        method, _, _ = tx.basic_get(q)
        tags.append(method.delivery_tag if method is not None else 0)
    for _ in range(3):
        tx.basic_publish("", q, b"in tx")
    tx.basic_ack(tags[1], multiple=True)
    conn.process_data_events(time_limit=0.05)
    channels = _connection_path(s, "conn") + "/channels"
    held = _channel(2)
    label = "channels of the connection"
    settled(s, channels, held, lambda c: c["messages_uncommitted"] == 3, label)
    tx.tx_commit()
    settled(s, channels, held, lambda c: c["messages_uncommitted"] == 0, label)
    settled(s, f"/api/queues/{V}/{q}", _queue_fields, lambda found: found["messages"] == 4)
    # A reject (or nack) is held too, but RabbitMQ counts only acks in acks_uncommitted.
    tx.basic_publish("", q, b"rolled back")
    tx.basic_reject(tags[2])
    conn.process_data_events(time_limit=0.05)
    settled(s, channels, held, lambda c: c["messages_uncommitted"] == 1, label)
    tx.tx_rollback()
    settled(
        s,
        channels,
        held,
        lambda c: c["messages_uncommitted"] == 0 and c["messages_unacknowledged"] == 1,
        label,
    )


@scenario("http fields: a channel's prefetch, confirms, unacked and its consumers")
def _channel_fields(s: Session) -> None:
    q = s.name()
    conn = _named(s, "conn")
    channel = conn.channel()
    channel.queue_declare(q)
    channel.confirm_delivery()
    for _ in range(3):
        channel.basic_publish("", q, b"m")
    # No basic.qos global=true: RabbitMQ 3.10 reports global_prefetch_count as it was
    # when the channel opened (the field is in its creation event only), streamq the
    # current limit (docs/compatibility.md; tests/integration/test_http_measured_fields.py).
    channel.basic_qos(prefetch_count=2)
    channel.basic_consume(q, lambda *a: None, consumer_tag="c", arguments={"x-priority": 3})
    conn.process_data_events(time_limit=0.2)
    path = _connection_path(s, "conn")
    settled(
        s,
        path + "/channels",
        _channel(1),
        lambda c: c["consumer_count"] == 1 and c["messages_unacknowledged"] == 2,
        "channels of the connection",
    )
    settled(s, path, _fields(CONNECTION_FIELDS), lambda c: c["channels"] == 1, "the connection")
    settled(s, f"/api/consumers/{V}", _consumers({q}), lambda found: len(found) == 1)
    settled(
        s,
        f"/api/queues/{V}/{q}",
        _queue_fields,
        lambda found: found["messages_unacknowledged"] == 2 and found["consumers"] == 1,
    )


@scenario("http fields: the node figures rabbitmqadmin and monitoring read")
def _node_figures(s: Session) -> None:
    def pick(body: Any) -> Any:
        node = body[0] if isinstance(body, list) and body else {}
        shown = {f: type(node.get(f)).__name__ for f in NODE_FIGURES}
        return shown | {"type": node.get("type"), "running": node.get("running")}

    settled(s, "/api/nodes", pick, lambda shown: shown["running"] is True)


@scenario("http fields: a stream's consumer fields")
def _stream_fields(s: Session) -> None:
    q = s.name()
    conn = _named(s, "conn")
    channel = conn.channel()
    channel.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    channel.basic_qos(prefetch_count=10)
    channel.basic_consume(q, lambda *a: None, consumer_tag="c")
    present = ("consumers", "single_active_consumer_tag", "exclusive_consumer_tag", "type")
    settled(
        s,
        f"/api/queues/{V}/{q}",
        lambda body: {f: body[f] for f in present if f in body},
        lambda found: found.get("consumers") == 1,
    )
    # Not `active`: RabbitMQ 3.10 registers a stream's consumers with active=false though
    # they receive (docs/compatibility.md); streamq says true.
    settled(
        s,
        f"/api/consumers/{V}",
        lambda body: [{k: v for k, v in c.items() if k != "active"} for c in _consumers({q})(body)],
        lambda found: len(found) == 1,
    )
