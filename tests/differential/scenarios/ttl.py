"""Message TTL of 0, per message (`expiration="0"`) and per queue (`x-message-ttl` 0):
RabbitMQ hands such a message to a consumer that has credit when it reaches the queue
(rabbit_amqqueue_process:deliver_or_enqueue tries the consumers before it enqueues, and
never looks at the expiry then); otherwise it expires at once, or, queued behind other
messages, when it reaches the head, and is dead-lettered with reason `expired`."""

from __future__ import annotations

from amqp_gateway.codec import BasicProperties, DeliveryTag
from amqp_gateway.codec import methods as m
from tests.differential.harness import Conn, Session, scenario
from tests.differential.scenarios.basic import declare, depth, get

NOW = BasicProperties(expiration="0")


def consume(c: Conn, queue: str, prefetch: int, channel: int = 1, tag: str = "t") -> None:
    """basic.qos `prefetch` (0: no limit), then a consumer that acks."""
    c.call(channel, m.BasicQos(prefetch_count=prefetch))
    c.call(channel, m.BasicConsume(queue=queue, consumer_tag=tag))


def ack(c: Conn, tag: int, channel: int = 1) -> None:
    c.send(channel, m.BasicAck(delivery_tag=DeliveryTag(tag)))


def dead_letter_queue(s: Session, c: Conn, **arguments: object) -> None:
    """Queue `q` dead-letters through the default exchange to `dlq`."""
    declare(c, s.name("dlq"))
    dead = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": s.name("dlq")}
    declare(c, s.name(), **dead, **arguments)


def watch_dead_letters(s: Session) -> Conn:
    """A second connection consuming `dlq` without acks, so that a dead letter is read
    as it comes (deliveries, not a timed basic.get)."""
    watcher = s.channel(1, s.connect())
    watcher.call(1, m.BasicConsume(queue=s.name("dlq"), consumer_tag="dead", no_ack=True))
    return watcher


@scenario("ttl 0: expiration 0 to a consumer with credit is delivered and acked")
def _ready_consumer(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), 10)
    c.publish(1, "", s.name(), b"caught", NOW)
    c.expect(1, "basic.deliver")
    ack(c, 1)
    c.sync(1)
    depth(c, s.name())


@scenario("ttl 0: expiration 0 in a burst to a consumer with credit for some of it")
def _burst(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), 3)
    c.publish(1, "", s.name(), b"plain")
    for n in range(4):
        c.publish(1, "", s.name(), b"now %d" % n, NOW)
    c.expect(3, "basic.deliver")
    c.sync(1)
    depth(c, s.name())
    for tag in (1, 2, 3):
        ack(c, tag)
    c.quiet()
    depth(c, s.name())


@scenario("ttl 0: expiration 0 to a consumer at its prefetch limit expires")
def _full_consumer(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), 1)
    c.publish(1, "", s.name(), b"first")
    c.expect(1, "basic.deliver")
    c.publish(1, "", s.name(), b"too late", NOW)
    c.sync(1)
    depth(c, s.name())
    ack(c, 1)
    c.quiet()
    depth(c, s.name())


@scenario("ttl 0: expiration 0 without a consumer: get-empty, and a later consumer gets none")
def _no_consumer(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.publish(1, "", s.name(), b"gone", NOW)
    c.publish(1, "", s.name(), b"gone too", NOW)
    c.sync(1)
    get(c, s.name())
    consume(c, s.name(), 0)
    c.quiet()
    depth(c, s.name())


@scenario("ttl 0: x-message-ttl 0 to a consumer with credit is delivered")
def _queue_ttl_ready(s: Session) -> None:
    c = s.channel()
    declare(c, s.name(), **{"x-message-ttl": 0})
    consume(c, s.name(), 0)
    for n in range(3):
        c.publish(1, "", s.name(), b"m%d" % n)
    c.expect(3, "basic.deliver")
    c.send(1, m.BasicAck(delivery_tag=DeliveryTag(3), multiple=True))
    c.sync(1)
    depth(c, s.name())


@scenario("ttl 0: x-message-ttl 0 without a consumer: get-empty")
def _queue_ttl_no_consumer(s: Session) -> None:
    c = s.channel()
    declare(c, s.name(), **{"x-message-ttl": 0})
    c.publish(1, "", s.name(), b"gone")
    c.publish(1, "", s.name(), b"gone too", BasicProperties(expiration="60000"))
    c.sync(1)
    depth(c, s.name())
    get(c, s.name(), no_ack=True)


@scenario("ttl 0: expiration 0 with a dead-letter exchange and no consumer: x-death expired")
def _dead_letter_no_consumer(s: Session) -> None:
    c = s.channel()
    dead_letter_queue(s, c)
    watcher = watch_dead_letters(s)
    c.publish(1, "", s.name(), b"expired", BasicProperties(expiration="0", message_id="m1"))
    watcher.expect(1, "basic.deliver")
    get(c, s.name())


@scenario("ttl 0: x-message-ttl 0 with a dead-letter exchange and no consumer: x-death expired")
def _queue_ttl_dead_letter_no_consumer(s: Session) -> None:
    c = s.channel()
    dead_letter_queue(s, c, **{"x-message-ttl": 0})
    watcher = watch_dead_letters(s)
    c.publish(1, "", s.name(), b"expired", BasicProperties(message_id="m1"))
    watcher.expect(1, "basic.deliver")
    get(c, s.name())


@scenario("ttl 0: expiration 0 behind a queued message and a busy consumer expires")
def _behind_busy_consumer(s: Session) -> None:
    c = s.channel()
    dead_letter_queue(s, c)
    consume(c, s.name(), 1)
    c.publish(1, "", s.name(), b"first")
    c.expect(1, "basic.deliver")
    c.publish(1, "", s.name(), b"queued")
    c.publish(1, "", s.name(), b"expires at the head", NOW)
    c.sync(1)
    depth(c, s.name())  # both wait: the expired one is not at the head yet
    watcher = watch_dead_letters(s)
    ack(c, 1)
    c.expect(1, "basic.deliver")
    watcher.expect(1, "basic.deliver")
    ack(c, 2)
    c.quiet()
    depth(c, s.name())


@scenario("ttl 0: expiration 0 delivered, then nacked with requeue, expires")
def _requeued(s: Session) -> None:
    c = s.channel()
    dead_letter_queue(s, c)
    watcher = watch_dead_letters(s)
    consume(c, s.name(), 10)
    c.publish(1, "", s.name(), b"back", NOW)
    c.expect(1, "basic.deliver")
    c.send(1, m.BasicNack(delivery_tag=DeliveryTag(1), requeue=True))
    watcher.expect(1, "basic.deliver")
    c.quiet()
    depth(c, s.name())
