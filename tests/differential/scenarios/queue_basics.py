"""queue.declare, bind, purge and delete, and basic.get: the common paths."""

from __future__ import annotations

from amqp_gateway.codec import methods as m
from tests.differential.harness import Session, scenario


@scenario("queue.declare then passive")
def _declare_passive(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))


@scenario("queue.declare passive of a missing queue")
def _passive_missing(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))
    c.call(1, m.ChannelOpen())


@scenario("publish to the default exchange, get twice")
def _publish_get(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.publish(1, "", s.name(), b"hello")
    c.sync(1)
    c.call(1, m.BasicGet(queue=s.name(), no_ack=True))
    c.call(1, m.BasicGet(queue=s.name(), no_ack=True))


@scenario("publish to a missing exchange closes the channel")
def _publish_missing_exchange(s: Session) -> None:
    c = s.channel()
    c.publish(1, s.name("x"), "k", b"hello")
    c.sync(1)
    c.open(1)
    c.call(1, m.QueueDeclare(queue=s.name()))


@scenario("consume, publish, ack")
def _consume(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.call(1, m.BasicConsume(queue=s.name(), consumer_tag="ctag"))
    for body in (b"a", b"b"):
        c.publish(1, "", s.name(), body)
    c.expect(2, "basic.deliver")
    c.send(1, m.BasicAck(delivery_tag=2, multiple=True))
    c.sync(1)
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))
