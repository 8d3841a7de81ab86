"""Several consumers of one queue and queues whose messages expire, where RabbitMQ's
order is deterministic (issue 30): consumers of one channel take turns one message each
over a burst, prefetch limits what each takes and acks bring the rest in turns, and a
backlog mixing messages that expired with live ones delivers only the live ones, in
order (streamq delivers these in runs that stop before each expired message)."""

from __future__ import annotations

from amqp_gateway.codec import BasicProperties, DeliveryTag
from amqp_gateway.codec import methods as m
from tests.differential.harness import Conn, Session, scenario
from tests.differential.scenarios.basic import declare, depth

GONE = BasicProperties(expiration="0")
LATER = BasicProperties(expiration="600000")


def consume(c: Conn, queue: str, tag: str, **fields: object) -> None:
    c.call(1, m.BasicConsume(queue=queue, consumer_tag=tag, **fields))  # type: ignore[arg-type]


def burst(c: Conn, queue: str, count: int, start: int = 0) -> None:
    for n in range(start, start + count):
        c.publish(1, "", queue, b"%d" % n)


@scenario("work queue: three consumers of one channel take turns over a burst")
def _three_take_turns(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    for tag in ("a", "b", "c"):
        consume(c, s.name(), tag)
    burst(c, s.name(), 12)
    c.expect(12, "basic.deliver")
    depth(c, s.name())


@scenario("work queue: prefetch 2 each, acks bring the rest in turns")
def _prefetch_turns(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.call(1, m.BasicQos(prefetch_count=2))
    for tag in ("a", "b", "c"):
        consume(c, s.name(), tag)
    burst(c, s.name(), 10)
    c.expect(6, "basic.deliver")
    c.sync(1)
    depth(c, s.name())
    # One ack at a time: RabbitMQ settles an ack multiple consumer by consumer, each
    # taking what its credit allows before the next one's acks count (streamq hands the
    # freed credit out in turns; not compared here).
    for tag in (2, 3, 1, 4):
        c.send(1, m.BasicAck(delivery_tag=DeliveryTag(tag)))
        c.expect(1, "basic.deliver")
    depth(c, s.name())


@scenario("work queue: a backlog with expired messages among live ones, then a consumer")
def _expired_among_live(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    for n in range(12):
        c.publish(1, "", s.name(), b"%d" % n, GONE if n % 4 == 1 else LATER if n % 2 else None)
    c.sync(1)
    consume(c, s.name(), "late")
    c.expect(9, "basic.deliver")
    depth(c, s.name())


@scenario("work queue: queue TTL and expired messages, two consumers on one channel")
def _queue_ttl_two_consumers(s: Session) -> None:
    c = s.channel()
    declare(c, s.name(), **{"x-message-ttl": 600_000})
    for n in range(12):
        c.publish(1, "", s.name(), b"%d" % n, GONE if n % 3 == 2 else None)
    c.sync(1)
    c.call(1, m.BasicQos(prefetch_count=3))
    consume(c, s.name(), "a")
    consume(c, s.name(), "b")  # logs a's deliveries that came before its consume-ok
    c.expect_logged(6, "basic.deliver")
    for tag in (1, 2):
        c.send(1, m.BasicAck(delivery_tag=DeliveryTag(tag)))
        c.expect(1, "basic.deliver")
    depth(c, s.name())
