"""The management HTTP API as clients use it (rabbitmqadmin, the Go and Python admin
libraries, the web UI): status codes and the fields those clients read, never whole
bodies, which differ legitimately (statistics, node names, extra fields)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from amqp_gateway.codec import methods as m
from tests.differential.harness import Session, scenario

V = "%2F"  # the default vhost "/" in a path
QUEUE_FIELDS = ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments")
EXCHANGE_FIELDS = ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments")
BINDING_FIELDS = (
    "source",
    "destination",
    "destination_type",
    "routing_key",
    "arguments",
    "properties_key",
)
GET_FIELDS = ("payload", "payload_bytes", "payload_encoding", "redelivered", "message_count")
GET_FIELDS += ("exchange", "routing_key")


def raw(
    s: Session,
    method: str,
    path: str,
    body: bytes | None = None,
    content_type: str = "application/json",
) -> tuple[int, dict[str, str], Any]:
    """One request with `body` sent as is: (status, headers with lower-case names,
    parsed JSON or None)."""
    return s.http_raw(method, path, body, content_type)


def status(s: Session, method: str, path: str, body: object = None) -> None:
    """Records the status of one request."""
    code, _ = s.http(method, path, body)
    s.record(method, path, code)


def fields(s: Session, path: str, names: tuple[str, ...]) -> None:
    """Records the status of GET `path` and the fields `names` of its object."""
    code, body = s.http("GET", path)
    picked = {n: body.get(n) for n in names} if isinstance(body, dict) and code == 200 else None
    s.record("GET", path, code, picked)


def got(
    s: Session, queue: str, request: dict[str, object], names: tuple[str, ...] = GET_FIELDS
) -> None:
    """Records POST .../get: its status and the fields `names` of each message."""
    code, body = s.http("POST", f"/api/queues/{V}/{queue}/get", request)
    if code != 200 or not isinstance(body, list):
        s.record("get", request, code)
        return
    s.record("get", request, code, [{n: one.get(n) for n in names} for one in body])


def published(s: Session, exchange: str, request: dict[str, object]) -> None:
    """Records POST .../publish: its status and `routed`."""
    code, body = s.http("POST", f"/api/exchanges/{V}/{exchange}/publish", request)
    routed = body.get("routed") if isinstance(body, dict) and code == 200 else None
    s.record("publish", code, routed)


def message(routing_key: str, payload: str, **extra: object) -> dict[str, object]:
    return {
        "routing_key": routing_key,
        "payload": payload,
        "payload_encoding": "string",
        "properties": {},
        **extra,
    }


# Queues.


@scenario("http: PUT a queue, GET its fields, PUT it again")
def _queue_put(s: Session) -> None:
    q = s.name()
    arguments = {"x-max-length": 10, "x-message-ttl": 60000, "x-queue-mode": "lazy"}
    status(s, "PUT", f"/api/queues/{V}/{q}", {"durable": True, "arguments": arguments})
    fields(s, f"/api/queues/{V}/{q}", QUEUE_FIELDS)
    status(s, "PUT", f"/api/queues/{V}/{q}", {"durable": True, "arguments": arguments})
    status(s, "PUT", f"/api/queues/{V}/{q}", {"durable": False, "arguments": arguments})
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=q, passive=True))


@scenario("http: PUT an auto-delete queue")
def _queue_put_auto_delete(s: Session) -> None:
    q = s.name()
    status(s, "PUT", f"/api/queues/{V}/{q}", {"auto_delete": True, "durable": False})
    fields(s, f"/api/queues/{V}/{q}", QUEUE_FIELDS)
    c = s.channel()
    c.call(1, m.BasicConsume(queue=q, consumer_tag="t"))
    c.call(1, m.BasicCancel(consumer_tag="t"))
    fields(s, f"/api/queues/{V}/{q}", ("name",))


@scenario("http: PUT a queue and an exchange with empty bodies takes the defaults")
def _defaults(s: Session) -> None:
    q, x = s.name(), s.name("x")
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    fields(s, f"/api/queues/{V}/{q}", QUEUE_FIELDS)
    status(s, "PUT", f"/api/exchanges/{V}/{x}", {})
    fields(s, f"/api/exchanges/{V}/{x}", EXCHANGE_FIELDS)
    status(s, "PUT", f"/api/exchanges/{V}/amq.direct", {"type": "direct"})
    status(s, "PUT", f"/api/exchanges/{V}/amq.direct", {"type": "direct", "durable": True})


def _bad_queue(body: object) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        status(s, "PUT", f"/api/queues/{V}/{s.name()}", body)
        fields(s, f"/api/queues/{V}/{s.name()}", ("name",))

    return run


for _label, _body in (
    ("a number for durable", {"durable": 5}),
    ("a list for arguments", {"arguments": [1, 2]}),
    ("an unknown x-queue-type", {"arguments": {"x-queue-type": "nonsense"}}),
    ("a string x-max-length", {"arguments": {"x-max-length": "ten"}}),
    ("a negative x-message-ttl", {"arguments": {"x-message-ttl": -1}}),
):
    scenario(f"http: PUT a queue with {_label}")(_bad_queue(_body))


@scenario("http: PUT a queue in a missing vhost, GET missing queue")
def _queue_missing_vhost(s: Session) -> None:
    status(s, "PUT", f"/api/queues/{s.name('vh')}/{s.name()}", {"durable": True})
    fields(s, f"/api/queues/{V}/{s.name('missing')}", ("name",))
    fields(s, f"/api/queues/{s.name('vh')}/{s.name()}", ("name",))


@scenario("http: DELETE a queue, again, and with if-empty on a full one")
def _queue_delete(s: Session) -> None:
    for q in (s.name("a"), s.name("b")):
        status(s, "PUT", f"/api/queues/{V}/{q}", {"durable": False})
    published(s, "amq.default", message(s.name("b"), "x"))
    status(s, "DELETE", f"/api/queues/{V}/{s.name('a')}")
    status(s, "DELETE", f"/api/queues/{V}/{s.name('a')}")
    status(s, "DELETE", f"/api/queues/{V}/{s.name('b')}?if-empty=true")
    fields(s, f"/api/queues/{V}/{s.name('b')}", ("name",))
    status(s, "DELETE", f"/api/queues/{V}/{s.name('b')}")


@scenario("http: DELETE a queue's contents purges it")
def _purge(s: Session) -> None:
    q = s.name()
    status(s, "PUT", f"/api/queues/{V}/{q}", {"durable": False})
    for body in ("a", "b", "c"):
        published(s, "amq.default", message(q, body))
    status(s, "DELETE", f"/api/queues/{V}/{q}/contents")
    got(s, q, {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
    status(s, "DELETE", f"/api/queues/{V}/{s.name('missing')}/contents")


# Exchanges.


@scenario("http: PUT exchanges of each type, GET their fields")
def _exchange_put(s: Session) -> None:
    for kind in ("direct", "fanout", "topic", "headers"):
        x = s.name(kind)
        body = {"type": kind, "durable": kind != "fanout", "arguments": {"k": "v"}}
        status(s, "PUT", f"/api/exchanges/{V}/{x}", body)
        fields(s, f"/api/exchanges/{V}/{x}", EXCHANGE_FIELDS)
    status(s, "PUT", f"/api/exchanges/{V}/{s.name('direct')}", {"type": "direct", "durable": True})
    status(s, "PUT", f"/api/exchanges/{V}/{s.name('direct')}", {"type": "fanout", "durable": True})


@scenario("http: PUT exchanges with bad bodies")
def _exchange_bad(s: Session) -> None:
    for label, body in (
        ("bad-type", {"type": "nonsense"}),
        ("number-internal", {"type": "direct", "internal": 3}),
    ):
        status(s, "PUT", f"/api/exchanges/{V}/{s.name(label)}", body)
        fields(s, f"/api/exchanges/{V}/{s.name(label)}", ("name",))


@scenario("http: PUT an exchange with a list for arguments")
def _exchange_list_arguments(s: Session) -> None:
    status(s, "PUT", f"/api/exchanges/{V}/{s.name()}", {"type": "direct", "arguments": ["a"]})
    fields(s, f"/api/exchanges/{V}/{s.name()}", ("name",))


@scenario("http: PUT of a new amq. exchange is refused")
def _exchange_amq(s: Session) -> None:
    status(s, "PUT", f"/api/exchanges/{V}/amq.{s.name()}", {"type": "direct"})
    fields(s, f"/api/exchanges/{V}/amq.{s.name()}", ("name",))


@scenario("http: DELETE an exchange, again, a default one, and with if-unused")
def _exchange_delete(s: Session) -> None:
    x, q = s.name("x"), s.name()
    status(s, "PUT", f"/api/exchanges/{V}/{x}", {"type": "direct"})
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    status(s, "POST", f"/api/bindings/{V}/e/{x}/q/{q}", {"routing_key": "k"})
    status(s, "DELETE", f"/api/exchanges/{V}/{x}?if-unused=true")
    status(s, "DELETE", f"/api/exchanges/{V}/{x}")
    status(s, "DELETE", f"/api/exchanges/{V}/{x}")
    fields(s, f"/api/exchanges/{V}/{x}", ("name",))


# Bindings.


@scenario("http: POST a binding, GET it, DELETE it twice")
def _binding(s: Session) -> None:
    x, q = s.name("x"), s.name()
    status(s, "PUT", f"/api/exchanges/{V}/{x}", {"type": "direct"})
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    status(s, "POST", f"/api/bindings/{V}/e/{x}/q/{q}", {"routing_key": "k"})
    code, body = s.http("GET", f"/api/bindings/{V}/e/{x}/q/{q}")
    s.record("GET pair", code, [{n: b.get(n) for n in BINDING_FIELDS} for b in body])
    fields(s, f"/api/bindings/{V}/e/{x}/q/{q}/k", BINDING_FIELDS)
    published(s, x, message("k", "through"))
    status(s, "DELETE", f"/api/bindings/{V}/e/{x}/q/{q}/k")
    status(s, "DELETE", f"/api/bindings/{V}/e/{x}/q/{q}/k")
    published(s, x, message("k", "nowhere"))


@scenario("http: a binding with arguments has a hashed properties key")
def _binding_arguments(s: Session) -> None:
    x, q = s.name("x"), s.name()
    status(s, "PUT", f"/api/exchanges/{V}/{x}", {"type": "headers"})
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    body = {"routing_key": "", "arguments": {"x-match": "all", "h": "v"}}
    code, headers, _ = raw(s, "POST", f"/api/bindings/{V}/e/{x}/q/{q}", json.dumps(body).encode())
    s.record("POST binding", code, headers.get("location"))
    code, listed = s.http("GET", f"/api/bindings/{V}/e/{x}/q/{q}")
    s.record("GET pair", code, [{n: b.get(n) for n in BINDING_FIELDS} for b in listed])
    published(s, x, message("", "match", properties={"headers": {"h": "v"}}))
    published(s, x, message("", "miss", properties={"headers": {"h": "w"}}))


@scenario("http: POST a binding answers with its Location")
def _binding_location(s: Session) -> None:
    x, q = s.name("x"), s.name()
    status(s, "PUT", f"/api/exchanges/{V}/{x}", {"type": "direct"})
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    for key in ("k", ""):
        body = json.dumps({"routing_key": key}).encode()
        code, headers, _ = raw(s, "POST", f"/api/bindings/{V}/e/{x}/q/{q}", body)
        s.record("POST binding", code, headers.get("location"))


@scenario("http: a binding key with a slash, a space and a tilde")
def _binding_odd_key(s: Session) -> None:
    x, q = s.name("x"), s.name()
    status(s, "PUT", f"/api/exchanges/{V}/{x}", {"type": "direct"})
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    status(s, "POST", f"/api/bindings/{V}/e/{x}/q/{q}", {"routing_key": "a/b c~d"})
    code, listed = s.http("GET", f"/api/bindings/{V}/e/{x}/q/{q}")
    keys = [b.get("properties_key") for b in listed]
    s.record("GET pair", code, keys)
    # As rabbitmqadmin deletes it: the properties_key quoted into the path.
    for key in keys:
        status(s, "DELETE", f"/api/bindings/{V}/e/{x}/q/{q}/{quote(key, safe='')}")


@scenario("http: exchange-to-exchange binding, and bindings to missing things")
def _binding_e2e(s: Session) -> None:
    x, y, q = s.name("x"), s.name("y"), s.name()
    status(s, "PUT", f"/api/exchanges/{V}/{x}", {"type": "fanout"})
    status(s, "PUT", f"/api/exchanges/{V}/{y}", {"type": "fanout"})
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    status(s, "POST", f"/api/bindings/{V}/e/{x}/e/{y}", {"routing_key": "r"})
    status(s, "POST", f"/api/bindings/{V}/e/{y}/q/{q}", {})
    published(s, x, message("anything", "two hops"))
    status(s, "POST", f"/api/bindings/{V}/e/{s.name('missing')}/q/{q}", {})
    status(s, "POST", f"/api/bindings/{V}/e/{x}/q/{s.name('missing')}", {})
    code, listed = s.http("GET", f"/api/exchanges/{V}/{x}/bindings/source")
    s.record("source", code, [{n: b.get(n) for n in BINDING_FIELDS} for b in listed])


# Publish and get.


@scenario("http: publish routed and unroutable, string and base64, bad encodings")
def _publish(s: Session) -> None:
    q = s.name()
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    published(s, "amq.default", message(q, "plain text"))
    published(s, "amq.default", message(s.name("nowhere"), "lost"))
    encoded = base64.b64encode(b"\x00\x01binary\xff").decode()
    published(s, "amq.default", message(q, encoded, payload_encoding="base64"))
    published(s, "amq.default", message(q, "x", payload_encoding="rot13"))
    published(s, "amq.default", message(q, "not base64!", payload_encoding="base64"))
    c = s.channel()
    for _ in range(3):
        c.call(1, m.BasicGet(queue=q, no_ack=True))


@scenario("http: publish to a missing exchange")
def _publish_missing(s: Session) -> None:
    published(s, s.name("missing-x"), message("k", "x"))
    published(s, "amq.direct", message("k", "x"))


@scenario("http: publish with properties, read over AMQP and over HTTP")
def _publish_properties(s: Session) -> None:
    q = s.name()
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    properties = {
        "delivery_mode": 2,
        "content_type": "application/json",
        "headers": {"h": "v", "n": 7},
        "correlation_id": "c-1",
        "priority": 3,
        "message_id": "m-1",
    }
    for _ in range(2):
        published(s, "amq.default", message(q, '{"a": 1}', properties=properties))
    got(
        s,
        q,
        {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
        (*GET_FIELDS, "properties"),
    )
    c = s.channel()
    c.call(1, m.BasicGet(queue=q, no_ack=True))


@scenario("http: get of a message without properties")
def _get_no_properties(s: Session) -> None:
    q = s.name()
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    published(s, "amq.default", message(q, "bare"))
    got(
        s,
        q,
        {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
        ("payload", "properties"),
    )


@scenario("http: get with an unknown ackmode")
def _get_bad_ackmode(s: Session) -> None:
    q = s.name()
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    published(s, "amq.default", message(q, "kept"))
    got(s, q, {"count": 1, "ackmode": "nonsense", "encoding": "auto"})
    got(s, q, {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})


def _get_count(counts: tuple[object, ...]) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        q = s.name()
        status(s, "PUT", f"/api/queues/{V}/{q}", {})
        published(s, "amq.default", message(q, "kept"))
        for count in counts:
            got(s, q, {"count": count, "ackmode": "ack_requeue_true", "encoding": "auto"})
        s.channel().call(1, m.QueueDeclare(queue=q, passive=True))

    return run


scenario("http: get with a count of zero")(_get_count((0, "0")))
scenario("http: get with a negative count")(_get_count((-1,)))


@scenario("http: get with each ackmode, redelivered and message_count")
def _get_ackmodes(s: Session) -> None:
    q = s.name()
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    for body in ("one", "two", "three"):
        published(s, "amq.default", message(q, body))
    for mode in ("ack_requeue_true", "reject_requeue_true", "ack_requeue_false"):
        got(s, q, {"count": 2, "ackmode": mode, "encoding": "auto"})
    got(s, q, {"count": 5, "ackmode": "reject_requeue_false", "encoding": "auto"})
    got(s, q, {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})


@scenario("http: get with base64 encoding, auto on binary, and truncate")
def _get_encodings(s: Session) -> None:
    q = s.name()
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    published(s, "amq.default", message(q, "hello world"))
    binary = base64.b64encode(b"\xff\xfe\x00bin").decode()
    published(s, "amq.default", message(q, binary, payload_encoding="base64"))
    got(s, q, {"count": 2, "ackmode": "ack_requeue_true", "encoding": "base64"})
    got(s, q, {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 4})
    got(s, q, {"count": 2, "ackmode": "ack_requeue_false", "encoding": "auto"})


@scenario("http: get with bad requests")
def _get_bad(s: Session) -> None:
    q = s.name()
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    published(s, "amq.default", message(q, "kept"))
    got(s, q, {"count": 1, "ackmode": "ack_requeue_true", "encoding": "rot13"})
    got(s, q, {"count": 1, "encoding": "auto"})
    got(s, s.name("missing"), {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
    got(s, q, {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})


# Strings for booleans and numbers, as rabbitmqadmin sends them.


@scenario("http: rabbitmqadmin strings for queue booleans and get count")
def _admin_strings(s: Session) -> None:
    q = s.name()
    body = {"durable": "true", "auto_delete": "false", "arguments": {}}
    status(s, "PUT", f"/api/queues/{V}/{q}", body)
    fields(s, f"/api/queues/{V}/{q}", QUEUE_FIELDS)
    published(s, "amq.default", message(q, "a"))
    published(s, "amq.default", message(q, "b"))
    got(
        s,
        q,
        {"count": "1", "ackmode": "ack_requeue_false", "encoding": "auto", "truncate": "50000"},
    )
    got(
        s, q, {"count": "5", "requeue": "false", "ackmode": "ack_requeue_false", "encoding": "auto"}
    )


@scenario("http: rabbitmqadmin strings for exchange booleans")
def _admin_strings_exchange(s: Session) -> None:
    x = s.name("x")
    body = {"type": "topic", "durable": "false", "auto_delete": "false", "internal": "false"}
    status(s, "PUT", f"/api/exchanges/{V}/{x}", body)
    fields(s, f"/api/exchanges/{V}/{x}", EXCHANGE_FIELDS)


@scenario("http: rabbitmqadmin publish with properties as strings")
def _admin_strings_publish(s: Session) -> None:
    q = s.name()
    status(s, "PUT", f"/api/queues/{V}/{q}", {})
    published(s, "amq.default", message(q, "p", properties={"delivery_mode": "2"}))
    got(s, q, {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})


# Malformed requests.


@scenario("http: malformed JSON bodies are refused")
def _malformed(s: Session) -> None:
    q, x = s.name(), s.name("x")
    for method, path in (
        ("PUT", f"/api/queues/{V}/{q}"),
        ("PUT", f"/api/exchanges/{V}/{x}"),
        ("POST", f"/api/exchanges/{V}/amq.default/publish"),
        ("PUT", f"/api/vhosts/{s.name('vh')}"),
    ):
        code, _, _ = raw(s, method, path, b'{"durable": tru')
        s.record(method, path, code)
    code, _, _ = raw(s, "PUT", f"/api/queues/{V}/{q}", b"[1, 2]")
    s.record("array body", code)
    fields(s, f"/api/queues/{V}/{q}", ("name",))


# Vhosts, users and permissions.


@scenario("http: PUT a vhost, a user and permissions, then connect as the user")
def _accounts(s: Session) -> None:
    vh, user = s.name("vh"), s.name("user")
    status(s, "PUT", f"/api/vhosts/{vh}", {})
    status(s, "PUT", f"/api/vhosts/{vh}", {})
    status(s, "PUT", f"/api/users/{user}", {"password": user, "tags": ""})
    status(s, "PUT", f"/api/users/{user}", {"password": user, "tags": "management"})
    fields(s, f"/api/users/{user}", ("name", "tags"))
    s.connect(vhost=vh, user=user, password=user)
    body = {"configure": ".*", "write": ".*", "read": ".*"}
    status(s, "PUT", f"/api/permissions/{vh}/{user}", body)
    fields(s, f"/api/permissions/{vh}/{user}", ("user", "vhost", "configure", "write", "read"))
    c = s.connect(vhost=vh, user=user, password=user)
    c.open(1)
    c.call(1, m.QueueDeclare(queue=s.name()))


@scenario("http: restricted permissions refuse AMQP operations")
def _restricted(s: Session) -> None:
    vh, user = s.name("vh"), s.name("user")
    status(s, "PUT", f"/api/vhosts/{vh}", {})
    status(s, "PUT", f"/api/users/{user}", {"password": user, "tags": ""})
    body = {"configure": "^allowed", "write": "", "read": ".*"}
    status(s, "PUT", f"/api/permissions/{vh}/{user}", body)
    c = s.connect(vhost=vh, user=user, password=user)
    c.open(1)
    c.call(1, m.QueueDeclare(queue="allowed"))
    c.call(1, m.QueueDeclare(queue="other"))
    c.open(2)
    c.publish(2, "", "allowed")
    c.sync(2)


@scenario("http: GET, DELETE and PUT of missing vhosts, users and permissions")
def _accounts_missing(s: Session) -> None:
    vh, user = s.name("vh"), s.name("user")
    fields(s, f"/api/vhosts/{vh}", ("name",))
    fields(s, f"/api/users/{user}", ("name",))
    fields(s, f"/api/permissions/{V}/{user}", ("user",))
    status(s, "DELETE", f"/api/vhosts/{vh}")
    status(s, "DELETE", f"/api/users/{user}")
    status(
        s, "PUT", f"/api/permissions/{vh}/guest", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    status(
        s, "PUT", f"/api/permissions/{V}/{user}", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    status(s, "PUT", f"/api/users/{user}", {"tags": ""})
    fields(s, f"/api/exchanges/{V}/{s.name('x')}", ("name",))
    fields(s, f"/api/exchanges/{vh}/amq.direct", ("name",))


@scenario("http: DELETE a vhost removes its queues")
def _vhost_delete(s: Session) -> None:
    vh = s.name("vh")
    status(s, "PUT", f"/api/vhosts/{vh}", {})
    status(s, "PUT", f"/api/queues/{vh}/{s.name()}", {})
    fields(s, f"/api/queues/{vh}/{s.name()}", QUEUE_FIELDS)
    status(s, "DELETE", f"/api/vhosts/{vh}")
    fields(s, f"/api/queues/{vh}/{s.name()}", ("name",))
    s.connect(vhost=vh)
