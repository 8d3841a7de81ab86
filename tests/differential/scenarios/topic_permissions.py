"""Topic permissions compared with RabbitMQ 3.10: the management API's codes and bodies
(one scenario user's entries only, since other scenarios run beside it), definitions
import and export, and what AMQP 0-9-1 refuses (basic.publish with a routing key,
queue.bind/unbind and exchange.bind/unbind with a binding key) with RabbitMQ's words."""

from __future__ import annotations

from typing import Any

from amqp_gateway.codec import BasicProperties
from amqp_gateway.codec import methods as m
from tests.differential.harness import Conn, Session, scenario

V = "%2F"
FULL = {"configure": ".*", "write": ".*", "read": ".*"}


def user(s: Session, topic: dict[str, str] | None = None, base: str = "tu") -> str:
    """A user of this scenario (password: its name) with full permissions on "/", and
    `topic` as a topic permission there; deleted at the end."""
    name = s.name(base)
    s.record("PUT user", s.http("PUT", f"/api/users/{name}", {"password": name, "tags": ""})[0])
    s.cleanups.append(lambda: s.http("DELETE", f"/api/users/{name}"))
    s.record("PUT permissions", s.http("PUT", f"/api/permissions/{V}/{name}", FULL)[0])
    if topic is not None:
        put_topic(s, name, topic)
    return name


def put_topic(s: Session, name: str, topic: dict[str, str]) -> None:
    s.record("PUT topic", topic, s.http("PUT", f"/api/topic-permissions/{V}/{name}", topic)[0])


def mine(name: str, body: Any) -> Any:
    """The entries of user `name` in a list answer, by exchange; the answer as it is
    if it is not a list."""
    if not isinstance(body, list):
        return body
    found = [e for e in body if isinstance(e, dict) and e.get("user") == name]
    keys = ("user", "vhost", "exchange", "write", "read")
    return sorted(({k: e.get(k) for k in keys} for e in found), key=lambda e: str(e["exchange"]))


def listed(s: Session, name: str, path: str) -> None:
    code, body = s.http("GET", path)
    s.record("GET", path.replace(name, "<user>"), code, mine(name, body) if code == 200 else None)


def channel_as(s: Session, name: str, number: int = 1) -> Conn:
    c = s.connect(user=name, password=name)
    c.open(number)
    return c


@scenario("topic permissions: management API codes and listings")
def _api(s: Session) -> None:
    name = user(s)
    pair = f"/api/topic-permissions/{V}/{name}"
    listed(s, name, pair)
    s.record("DELETE none", s.http("DELETE", pair)[0])
    put_topic(s, name, {"exchange": "amq.topic", "write": "^a", "read": "^b"})
    put_topic(s, name, {"exchange": "amq.topic", "write": "^c", "read": ""})
    put_topic(s, name, {"exchange": "other", "write": ".*", "read": ".*"})
    for path in (
        pair,
        "/api/topic-permissions",
        f"/api/users/{name}/topic-permissions",
        f"/api/vhosts/{V}/topic-permissions",
    ):
        listed(s, name, path)
    for body in (
        {"exchange": "amq.topic", "write": "([", "read": ""},
        {"exchange": "amq.topic", "write": "^a"},
        {"write": "^a", "read": "^a"},
    ):
        s.record("PUT bad", body, s.http("PUT", pair, body)[0])
    topic = {"exchange": "amq.topic", "write": ".*", "read": ".*"}
    for path in (f"/api/topic-permissions/{V}/{s.name('nobody')}", "/api/topic-permissions/no/x"):
        code, body = s.http("PUT", path, topic)
        s.record("PUT missing", code, body.get("reason") if isinstance(body, dict) else None)
        s.record("GET missing", s.http("GET", path)[0])
        s.record("DELETE missing", s.http("DELETE", path)[0])
    s.record(
        "GET user missing", s.http("GET", f"/api/users/{s.name('nobody')}/topic-permissions")[0]
    )
    s.record("GET vhost missing", s.http("GET", "/api/vhosts/no-such/topic-permissions")[0])
    s.record("DELETE one exchange", s.http("DELETE", pair + "?exchange=other")[0])
    listed(s, name, pair)


@scenario("topic permissions: deleting the user drops them")
def _user_deleted(s: Session) -> None:
    name = user(s, {"exchange": "amq.topic", "write": "^a", "read": "^b"})
    s.record("DELETE user", s.http("DELETE", f"/api/users/{name}")[0])
    s.record("PUT user", s.http("PUT", f"/api/users/{name}", {"password": name, "tags": ""})[0])
    listed(s, name, f"/api/users/{name}/topic-permissions")
    listed(s, name, "/api/topic-permissions")


@scenario("topic permissions: definitions import and export")
def _definitions(s: Session) -> None:
    name = user(s)
    entries = [
        {"user": name, "vhost": "/", "exchange": "amq.topic", "write": "^x", "read": "^y"},
        {"user": name, "vhost": "/", "exchange": "e2", "write": "", "read": ".*"},
    ]
    document = {"topic_permissions": entries}
    for _ in range(2):
        s.record("import", s.http("POST", "/api/definitions", document)[0])
    code, body = s.http("GET", "/api/definitions")
    s.record("export", code, mine(name, body.get("topic_permissions")) if code == 200 else None)
    c = channel_as(s, name)
    c.publish(1, "amq.topic", "x.1")
    c.sync(1)
    c.publish(1, "amq.topic", "y.1")
    c.sync(1)


@scenario("topic permissions: basic.publish checks write on the routing key")
def _publish(s: Session) -> None:
    name = user(s, {"exchange": "amq.topic", "write": "^tenant-a\\.", "read": ".*"})
    c = channel_as(s, name)
    c.call(1, m.ConfirmSelect())
    for _ in range(20):  # a run of allowed publishes
        c.publish(1, "amq.topic", "tenant-a.orders")
    c.publish(1, "amq.direct", "tenant-b.orders")  # not a topic exchange
    c.confirms(1, 21)
    c.publish(1, "amq.topic", "tenant-b.orders")
    c.sync(1)
    c.open(2)
    c.publish(2, s.name("missing"), "tenant-b.orders")  # 404 comes first
    c.sync(2)
    c.open(3)
    for _ in range(20):  # a run of refused publishes: the first closes the channel
        c.publish(3, "amq.topic", "tenant-z")
    c.sync(3)


@scenario("topic permissions: empty write regex allows only the empty routing key")
def _empty_regex(s: Session) -> None:
    name = user(s, {"exchange": "amq.topic", "write": "", "read": ""})
    c = channel_as(s, name)
    c.publish(1, "amq.topic", "")
    c.sync(1)
    c.publish(1, "amq.topic", "a")
    c.sync(1)


@scenario("topic permissions: other exchanges of type topic and other types")
def _exchange_types(s: Session) -> None:
    xt, xf = s.name("xt"), s.name("xf")
    name = user(s, {"exchange": xt, "write": "^ok$", "read": "^ok$"})
    put_topic(s, name, {"exchange": xf, "write": "^ok$", "read": "^ok$"})
    c = channel_as(s, name)
    c.call(1, m.ExchangeDeclare(exchange=xt, type="topic", auto_delete=True))
    c.call(1, m.ExchangeDeclare(exchange=xf, type="fanout", auto_delete=True))
    q = c.call(1, m.QueueDeclare(queue="", exclusive=True))[3]["queue"]
    c.call(1, m.QueueBind(queue=q, exchange=xf, routing_key="no"))  # fanout: not checked
    c.publish(1, xf, "no")
    c.publish(1, "amq.topic", "no")  # no topic permission on amq.topic
    c.call(1, m.QueueBind(queue=q, exchange=xt, routing_key="ok"))
    c.publish(1, xt, "ok")
    c.sync(1)
    c.publish(1, xt, "no")
    c.sync(1)


@scenario("topic permissions: binds and unbinds check read on the binding key")
def _bind(s: Session) -> None:
    name = user(s, {"exchange": "amq.topic", "write": ".*", "read": "^r\\."})
    c = channel_as(s, name)
    q = c.call(1, m.QueueDeclare(queue="", exclusive=True))[3]["queue"]
    x = s.name("x")
    c.call(1, m.ExchangeDeclare(exchange=x, type="fanout", auto_delete=True))
    c.call(1, m.QueueBind(queue=q, exchange="amq.topic", routing_key="r.1"))
    c.call(1, m.ExchangeBind(destination=x, source="amq.topic", routing_key="r.2"))
    c.call(1, m.QueueUnbind(queue=q, exchange="amq.topic", routing_key="r.1"))
    c.call(1, m.ExchangeUnbind(destination=x, source="amq.topic", routing_key="r.2"))
    calls = (
        m.QueueBind(queue=q, exchange="amq.topic", routing_key="w.1"),
        m.QueueUnbind(queue=q, exchange="amq.topic", routing_key="w.1"),
        m.ExchangeBind(destination=x, source="amq.topic", routing_key="w.1"),
        m.ExchangeUnbind(destination=x, source="amq.topic", routing_key="w.1"),
        m.QueueBind(queue=q, exchange=s.name("missing"), routing_key="w.1"),
    )
    for number, method in enumerate(calls, start=2):
        c.open(number)
        c.call(number, method)


@scenario("topic permissions: {username} and {vhost} expand, {client_id} stays literal")
def _variables(s: Session) -> None:
    write = "^{username}\\.|^v-{vhost}$|^{client_id}$"
    name = user(s, {"exchange": "amq.topic", "write": write, "read": ".*"})
    c = channel_as(s, name)
    for number, key in enumerate(
        (f"{name}.x", "v-/", "{client_id}", "someone-else.x", "client-1"), start=1
    ):
        if number > 1:
            c.open(number)
        c.publish(number, "amq.topic", key)
        c.sync(number)


@scenario("topic permissions: CC and BCC keys of a publish are not checked (3.10)")
def _cc(s: Session) -> None:
    name = user(s, {"exchange": "amq.topic", "write": "^ok$", "read": ".*"})
    c = channel_as(s, name)
    q = c.call(1, m.QueueDeclare(queue="", exclusive=True))[3]["queue"]
    c.call(1, m.QueueBind(queue=q, exchange="amq.topic", routing_key="denied"))
    headers = {"CC": ["denied"], "BCC": ["denied"]}
    c.publish(1, "amq.topic", "ok", b"x", BasicProperties(headers=headers))
    c.sync(1)
    c.call(1, m.QueueDeclare(queue=q, passive=True))
