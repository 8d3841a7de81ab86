"""Management API fields compared with RabbitMQ 3.10: a vhost's description, tags and
default queue type (kept, shown, replaced by a later PUT but the type, and given to a
queue declared without `x-queue-type`, when imported), and who declared an exchange. streamq's
refusals of what it cannot honour (`tracing: true`, range queries) are deliberate
differences (docs/compatibility.md), so they are not compared here."""

from __future__ import annotations

from typing import Any

from amqp_gateway.codec import methods as m
from tests.differential.harness import Session, scenario


def shown(body: Any, keys: tuple[str, ...]) -> Any:
    return {key: body.get(key) for key in keys} if isinstance(body, dict) else body


@scenario("vhost fields: description and tags kept, replaced by a later PUT")
def _vhost_metadata(s: Session) -> None:
    vhost = s.name("vhf")
    body = {"description": "team a", "tags": "eu,prod"}
    s.record("PUT", s.http("PUT", f"/api/vhosts/{vhost}", body)[0])
    s.cleanups.append(lambda: s.http("DELETE", f"/api/vhosts/{vhost}"))
    code, found = s.http("GET", f"/api/vhosts/{vhost}")
    s.record("GET", code, shown(found, ("description", "tags", "metadata", "tracing")))
    s.record("PUT again", s.http("PUT", f"/api/vhosts/{vhost}", {"tags": ["eu"]})[0])
    code, found = s.http("GET", f"/api/vhosts/{vhost}")
    s.record("GET again", code, shown(found, ("description", "tags", "metadata")))


@scenario("vhost fields: an imported default_queue_type types new queues")
def _default_queue_type(s: Session) -> None:
    # RabbitMQ 3.10 keeps the type from a definitions import (its HTTP PUT drops it,
    # which streamq does not copy: docs/compatibility.md).
    vhost = s.name("vhq")
    metadata = {"description": "typed", "tags": [], "default_queue_type": "quorum"}
    document = {"vhosts": [{"name": vhost, "metadata": metadata}]}
    s.record("import", s.http("POST", "/api/definitions", document)[0])
    s.cleanups.append(lambda: s.http("DELETE", f"/api/vhosts/{vhost}"))
    code, found = s.http("GET", f"/api/vhosts/{vhost}")
    s.record("GET", code, shown(found, ("description", "default_queue_type", "metadata")))
    c = s.connect(vhost=vhost)
    c.open(1)
    for name, exclusive in (("typed", False), ("exclusive", True)):
        queue = s.name(name)
        c.call(1, m.QueueDeclare(queue=queue, durable=not exclusive, exclusive=exclusive))
        code, found = s.http("GET", f"/api/queues/{vhost}/{queue}")
        arguments = found.get("arguments") if isinstance(found, dict) else None
        s.record("queue", name, code, arguments)


@scenario("exchange fields: user_who_performed_action")
def _exchange_user(s: Session) -> None:
    c = s.channel()
    exchange = s.name("x")
    c.call(1, m.ExchangeDeclare(exchange=exchange, type="fanout", auto_delete=True))
    for name in (exchange, "amq.direct"):
        code, found = s.http("GET", f"/api/exchanges/%2F/{name}")
        who = found.get("user_who_performed_action") if isinstance(found, dict) else None
        s.record("exchange", name == exchange, code, who)
