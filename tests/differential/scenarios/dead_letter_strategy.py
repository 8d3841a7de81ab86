"""`x-dead-letter-strategy` and the `dead-letter-strategy` policy key, as RabbitMQ 3.10
has them: a classic queue refuses the argument whatever its value; a quorum queue takes
`at-most-once` and `at-least-once`; with `at-least-once`, `x-overflow: reject-publish`
and a dead-letter exchange, a dead letter that a full target refuses stays in the source
(neither ready nor delivered: the management API counts it in `messages_dlx`), where
at-most-once, and at-least-once without reject-publish, drop it.

RabbitMQ's dead-letter worker sends a refused dead letter again after
`dead_letter_worker_publisher_confirm_timeout` (3 minutes), too long for a scenario: the
move once the target has room is tested against streamq alone
(tests/integration/test_dlx_at_least_once.py). The queue figures of RabbitMQ's
management API are emitted every few seconds: a scenario polls them until they settle."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from amqp_gateway.codec import methods as m
from tests.differential.harness import Conn, Session, scenario
from tests.differential.scenarios.basic import depth, get
from tests.differential.scenarios.exchange import call_reopen

STATS_TIMEOUT_S = 20.0  # by default RabbitMQ emits a quorum queue's figures every 5 s
STATS_EVERY_S = 0.2
FIGURES = ("messages", "messages_ready", "messages_unacknowledged", "messages_dlx")


def quorum(queue: str, **arguments: object) -> m.QueueDeclare:
    return m.QueueDeclare(
        queue=queue,
        durable=True,
        arguments={"x-queue-type": "quorum", **arguments},  # type: ignore[arg-type]
    )


def figures(s: Session, queue: str, done: Callable[[dict[str, Any]], bool]) -> None:
    """Poll the queue's management figures until `done` holds (or the time is up), then
    record them."""
    deadline = time.monotonic() + STATS_TIMEOUT_S
    while True:
        status, body = s.http("GET", f"/api/queues/%2F/{queue}")
        found = body if status == 200 and isinstance(body, dict) else {}
        if done(found) or time.monotonic() > deadline:
            break
        time.sleep(STATS_EVERY_S)
    s.record(queue, {key: found.get(key) for key in FIGURES})


def full_target(s: Session, c: Conn) -> str:
    """A classic queue that holds one message and refuses more; it holds one."""
    target = s.name("target")
    c.call(
        1,
        m.QueueDeclare(queue=target, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}),
    )
    c.publish(1, "", target, b"filler")
    c.sync(1)
    return target


def reject_one(s: Session, c: Conn, source: str) -> None:
    """Publish to `source`, get the message and reject it without requeue (with pika:
    RabbitMQ's quorum queues add `x-delivery-count` to a first delivery, streamq does
    not, a difference documented elsewhere and not this scenario's)."""
    c.publish(1, "", source, b"dead")
    c.sync(1)
    channel = s.pika().channel()
    method, _, body = channel.basic_get(source)
    s.record("got", body)
    if method is not None:
        channel.basic_reject(method.delivery_tag, requeue=False)
    channel.connection.close()


def dead_letters_to(target: str, **more: object) -> dict[str, object]:
    return {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target, **more}


@scenario("dead-letter strategy: a classic queue refuses the argument, whatever its value")
def _classic(s: Session) -> None:
    c = s.channel()
    for index, value in enumerate(("at-least-once", "at-most-once", "twice")):
        arguments = {"x-dead-letter-strategy": value}
        call_reopen(c, m.QueueDeclare(queue=s.name(f"c{index}"), arguments=arguments))


@scenario("dead-letter strategy: a quorum queue takes either value and refuses others")
def _quorum_values(s: Session) -> None:
    c = s.channel()
    for index, value in enumerate(("at-least-once", "at-most-once", "twice", "")):
        call_reopen(c, quorum(s.name(f"q{index}"), **{"x-dead-letter-strategy": value}))
    # Redeclared with the other value (RabbitMQ does not compare this argument).
    call_reopen(c, quorum(s.name("q0"), **{"x-dead-letter-strategy": "at-most-once"}))


@scenario("dead-letter strategy: at-least-once holds what a full target refuses")
def _holds(s: Session) -> None:
    c = s.channel()
    target = full_target(s, c)
    source = s.name("source")
    arguments = dead_letters_to(
        target, **{"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    )
    c.call(1, quorum(source, **arguments))
    reject_one(s, c, source)
    figures(s, source, lambda q: q.get("messages_dlx") == 1 and q.get("messages_ready") == 0)
    depth(c, source)
    depth(c, target)
    get(c, source)  # empty: nothing of it is ready


@scenario("dead-letter strategy: at-most-once, or at-least-once without reject-publish, drops")
def _drops(s: Session) -> None:
    c = s.channel()
    target = full_target(s, c)
    for index, strategy in enumerate(("at-most-once", "at-least-once")):
        source = s.name(f"source{index}")
        c.call(1, quorum(source, **dead_letters_to(target, **{"x-dead-letter-strategy": strategy})))
        reject_one(s, c, source)
        figures(s, source, lambda q: q.get("messages") == 0 and q.get("messages_dlx") == 0)
        depth(c, source)
    depth(c, target)


@scenario("dead-letter strategy: the policy key sets it on a quorum queue")
def _policy(s: Session) -> None:
    c = s.channel()
    target = full_target(s, c)
    source = s.name("source")
    definition = {"dead-letter-strategy": "at-least-once", "overflow": "reject-publish"}
    status, _ = s.http(
        "PUT",
        f"/api/policies/%2F/{s.name('policy')}",
        {"pattern": f"^{source}$", "apply-to": "queues", "definition": definition},
    )
    s.cleanups.append(lambda: s.http("DELETE", f"/api/policies/%2F/{s.name('policy')}"))
    s.record("policy", status)
    c.call(1, quorum(source, **dead_letters_to(target)))
    reject_one(s, c, source)
    figures(s, source, lambda q: q.get("messages_dlx") == 1 and q.get("messages_ready") == 0)
    depth(c, target)


@scenario("dead-letter strategy: a policy with an unknown strategy is refused")
def _policy_refused(s: Session) -> None:
    status, body = s.http(
        "PUT",
        f"/api/policies/%2F/{s.name('policy')}",
        {"pattern": "^nothing$", "definition": {"dead-letter-strategy": "twice"}},
    )
    s.cleanups.append(lambda: s.http("DELETE", f"/api/policies/%2F/{s.name('policy')}"))
    reason = body.get("reason", "") if isinstance(body, dict) else ""
    s.record("policy", status, "is not a valid dead letter strategy" in reason)


@scenario("dead-letter strategy: a quorum queue overflows reject-publish-dlx as drop-head")
def _quorum_reject_publish_dlx(s: Session) -> None:
    c = s.channel()
    dead = s.name("dead")
    c.call(1, m.QueueDeclare(queue=dead))
    source = s.name("source")
    overflow = {"x-overflow": "reject-publish-dlx", "x-max-length": 1}
    c.call(1, quorum(source, **dead_letters_to(dead, **overflow)))
    c.call(1, m.ConfirmSelect())
    for body in (b"first", b"second"):
        c.publish(1, "", source, body)
    c.confirms(1, 2)
    depth(c, source)
    channel = s.pika().channel()
    for queue in (dead, source):
        method, _, body = channel.basic_get(queue, auto_ack=True)
        s.record(queue, None if method is None else body)
    channel.connection.close()
