"""basic.consume, basic.cancel and basic.qos, and the settlement of deliveries (ack, nack,
reject, recover): consumer tags, exclusivity, prefetch, consumer priorities, single
active consumers, the cancel a consumer gets when its queue goes, and the 406s of acks
that name no delivery."""

from __future__ import annotations

from amqp_gateway.codec import BasicProperties
from amqp_gateway.codec import methods as m
from tests.differential.harness import Conn, Session, scenario
from tests.differential.scenarios.basic import declare, depth, get


def consume(c: Conn, queue: str, tag: str, channel: int = 1, **fields: object) -> None:
    c.call(channel, m.BasicConsume(queue=queue, consumer_tag=tag, **fields))  # type: ignore[arg-type]


def publish_all(c: Conn, queue: str, *bodies: bytes, channel: int = 1) -> None:
    for body in bodies:
        c.publish(channel, "", queue, body)


def deliveries(c: Conn, count: int) -> None:
    c.expect(count, "basic.deliver")


def ack(c: Conn, tag: int, *, multiple: bool = False, channel: int = 1) -> None:
    c.send(channel, m.BasicAck(delivery_tag=tag, multiple=multiple))  # type: ignore[arg-type]


def expect_in_any_order(c: Conn, *names: str) -> None:
    """Read one observation of each of `names`, which come from different channels
    (different processes in RabbitMQ, in either order), and log them by channel."""
    start = len(c.session.log)
    c.expect(len(names), *names)
    c.session.log[start:] = sorted(c.session.log[start:], key=lambda o: (o[2], o[3]))


def reopen_and_count(c: Conn, queue: str) -> None:
    """Close channel 1 (its unacked messages go back), open it again and log the count."""
    c.call(1, m.ChannelClose(reply_code=200, reply_text="bye"))
    c.open(1)
    depth(c, queue)


# basic.consume


@scenario("basic.consume with a given tag and a generated one")
def _tags(s: Session) -> None:
    c = s.channel()
    declare(c, s.name("a"))
    declare(c, s.name("b"))
    consume(c, s.name("a"), "given")
    consume(c, s.name("b"), "")
    c.publish(1, "", s.name("a"), b"to given")
    deliveries(c, 1)
    c.publish(1, "", s.name("b"), b"to generated")
    deliveries(c, 1)
    depth(c, s.name("a"))


@scenario("basic.consume nowait: no consume-ok, deliveries still come")
def _consume_nowait(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.send(1, m.BasicConsume(queue=s.name(), consumer_tag="quiet", nowait=True))
    c.publish(1, "", s.name(), b"x")
    deliveries(c, 1)


@scenario("basic.consume with a tag in use on the channel closes the connection 530")
def _duplicate_tag(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "same")
    consume(c, s.name(), "same")


@scenario("basic.consume with a tag in use on another channel is fine")
def _tag_other_channel(s: Session) -> None:
    c = s.channel()
    s.channel(2)
    declare(c, s.name())
    consume(c, s.name(), "same", 1)
    consume(c, s.name(), "same", 2)
    depth(c, s.name())


@scenario("basic.consume exclusive while another consumer exists is refused 403")
def _exclusive_after(s: Session) -> None:
    c = s.channel()
    s.channel(2)
    declare(c, s.name())
    consume(c, s.name(), "first", 1)
    consume(c, s.name(), "sole", 2, exclusive=True)
    depth(c, s.name())


@scenario("basic.consume beside an exclusive consumer is refused 403")
def _exclusive_before(s: Session) -> None:
    c = s.channel()
    other = s.connect()
    other.open(1)
    declare(c, s.name())
    consume(c, s.name(), "sole", exclusive=True)
    consume(other, s.name(), "second")
    consume(c, s.name(), "same channel")


@scenario("basic.consume exclusive again after the exclusive consumer is cancelled")
def _exclusive_released(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "sole", exclusive=True)
    c.call(1, m.BasicCancel(consumer_tag="sole"))
    consume(c, s.name(), "next", exclusive=True)
    depth(c, s.name())


@scenario("basic.consume no_local still delivers the connection's own publishes")
def _no_local(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "local", no_local=True)
    c.publish(1, "", s.name(), b"mine")
    deliveries(c, 1)


@scenario("basic.consume from a missing queue closes the channel 404")
def _consume_missing(s: Session) -> None:
    c = s.channel()
    consume(c, s.name("missing"), "t")
    c.open(1)
    consume(c, s.name("missing"), "")


@scenario("basic.consume on an exclusive queue of another connection is refused 405")
def _consume_locked(s: Session) -> None:
    owner = s.channel()
    owner.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))
    other = s.connect()
    other.open(1)
    consume(other, s.name(), "t")


@scenario("basic.consume x-priority that is not an integer is refused 406")
def _bad_priority(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "t", arguments={"x-priority": "high"})


@scenario("basic.consume no_ack: deliveries need no ack, and an ack of one is 406")
def _no_ack(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "t", no_ack=True)
    publish_all(c, s.name(), b"a", b"b")
    deliveries(c, 2)
    depth(c, s.name())
    ack(c, 1)
    c.sync(1)


@scenario("basic.consume two consumers on one channel share the delivery tags")
def _two_consumers_tags(s: Session) -> None:
    c = s.channel()
    for queue in ("a", "b"):
        declare(c, s.name(queue))
        consume(c, s.name(queue), queue)
    for queue in ("a", "b", "a", "b", "b"):
        c.publish(1, "", s.name(queue), queue.encode())
        deliveries(c, 1)
    ack(c, 4, multiple=True)
    ack(c, 5)
    c.sync(1)
    depth(c, s.name("a"))


@scenario("basic.consume two consumers of one queue take turns")
def _round_robin(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "one")
    consume(c, s.name(), "two")
    publish_all(c, s.name(), b"1", b"2", b"3", b"4", b"5")
    deliveries(c, 5)


@scenario("basic.consume of a queue with messages delivers them in order")
def _backlog(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    publish_all(c, s.name(), b"1", b"2", b"3")
    c.sync(1)
    consume(c, s.name(), "late")
    deliveries(c, 3)


@scenario("basic.consume redelivers to another consumer what a closed channel left unacked")
def _redelivered_to_other(s: Session) -> None:
    c = s.channel()
    s.channel(2)
    declare(c, s.name())
    consume(c, s.name(), "first", 1)
    publish_all(c, s.name(), b"1", b"2")
    deliveries(c, 2)
    ack(c, 1)
    c.call(1, m.ChannelClose(reply_code=200, reply_text="bye"))
    consume(c, s.name(), "second", 2)
    deliveries(c, 1)


# basic.cancel


@scenario("basic.cancel of an unknown tag answers cancel-ok")
def _cancel_unknown(s: Session) -> None:
    c = s.channel()
    c.call(1, m.BasicCancel(consumer_tag="never"))
    c.call(1, m.BasicCancel(consumer_tag=""))


@scenario("basic.cancel frees the consumer tag for another basic.consume")
def _tag_reused(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "again")
    c.call(1, m.BasicCancel(consumer_tag="again"))
    consume(c, s.name(), "again")
    c.publish(1, "", s.name(), b"x")
    deliveries(c, 1)


@scenario("basic.cancel nowait: no cancel-ok, and no more deliveries")
def _cancel_nowait(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "t")
    c.send(1, m.BasicCancel(consumer_tag="t", nowait=True))
    c.sync(1)
    c.publish(1, "", s.name(), b"stays")
    c.sync(1)
    depth(c, s.name())


@scenario("basic.cancel keeps the consumer's deliveries unacked; they can still be acked")
def _cancel_then_ack(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "t")
    publish_all(c, s.name(), b"a", b"b", b"c")
    deliveries(c, 3)
    c.call(1, m.BasicCancel(consumer_tag="t"))
    ack(c, 2)
    c.sync(1)
    reopen_and_count(c, s.name())


@scenario("basic.cancel after the queue was deleted by another connection")
def _cancel_by_other_connection(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "doomed")
    other = s.connect()
    other.open(1)
    other.call(1, m.QueueDelete(queue=s.name()))
    c.expect(1, "basic.cancel")
    c.call(1, m.BasicCancel(consumer_tag="doomed"))


@scenario("basic.cancel from the broker when the queue is deleted by another channel")
def _cancel_by_other_channel(s: Session) -> None:
    c = s.channel()
    s.channel(2)
    declare(c, s.name())
    consume(c, s.name(), "doomed")
    c.send(2, m.QueueDelete(queue=s.name()))
    expect_in_any_order(c, "basic.cancel", "queue.delete-ok")
    c.sync(1)


@scenario("basic.cancel from the broker when the consumer's own channel deletes the queue")
def _cancel_by_same_channel(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "doomed")
    c.publish(1, "", s.name(), b"unacked")
    deliveries(c, 1)
    c.send(1, m.QueueDelete(queue=s.name()))
    c.expect(2, "queue.delete-ok", "basic.cancel")
    ack(c, 1)
    c.sync(1)


# basic.qos


@scenario("basic.qos prefetch_count=1 holds the next delivery until the ack")
def _prefetch_one(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.call(1, m.BasicQos(prefetch_count=1))
    consume(c, s.name(), "t")
    publish_all(c, s.name(), b"1", b"2", b"3")
    deliveries(c, 1)
    c.quiet()
    ack(c, 1)
    deliveries(c, 1)
    ack(c, 2)
    deliveries(c, 1)


@scenario("basic.qos global=true limits the channel across consumers")
def _prefetch_global(s: Session) -> None:
    c = s.channel()
    for queue in ("a", "b"):
        declare(c, s.name(queue))
    c.call(1, m.BasicQos(prefetch_count=1, global_=True))
    consume(c, s.name("a"), "a")
    consume(c, s.name("b"), "b")
    c.publish(1, "", s.name("a"), b"a1")
    deliveries(c, 1)
    c.publish(1, "", s.name("b"), b"b1")
    c.quiet()
    ack(c, 1)
    deliveries(c, 1)


@scenario("basic.qos per consumer applies to consumers created after it")
def _prefetch_later(s: Session) -> None:
    c = s.channel()
    for queue in ("a", "b"):
        declare(c, s.name(queue))
    consume(c, s.name("a"), "unlimited")
    c.call(1, m.BasicQos(prefetch_count=1))
    consume(c, s.name("b"), "limited")
    publish_all(c, s.name("a"), b"a1", b"a2", b"a3")
    deliveries(c, 3)
    publish_all(c, s.name("b"), b"b1", b"b2")
    deliveries(c, 1)
    c.quiet()
    depth(c, s.name("b"))


@scenario("basic.qos prefetch_size other than 0 closes the connection 540")
def _prefetch_size(s: Session) -> None:
    c = s.channel()
    c.call(1, m.BasicQos(prefetch_size=1000, prefetch_count=1))


@scenario("basic.qos prefetch_count=0 means unlimited")
def _prefetch_zero(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.call(1, m.BasicQos(prefetch_count=0))
    consume(c, s.name(), "t")
    publish_all(c, s.name(), *(str(n).encode() for n in range(5)))
    deliveries(c, 5)


# Consumer priorities and single active consumers.


@scenario("basic.consume x-priority: the higher consumer gets what it can take")
def _consumer_priority(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.call(1, m.BasicQos(prefetch_count=2))
    consume(c, s.name(), "low", arguments={"x-priority": 1})
    consume(c, s.name(), "high", arguments={"x-priority": 10})
    publish_all(c, s.name(), b"1", b"2", b"3")
    deliveries(c, 3)


@scenario("basic.consume on a single-active-consumer queue: the first gets all until it goes")
def _single_active(s: Session) -> None:
    c = s.channel()
    declare(c, s.name(), **{"x-single-active-consumer": True})
    consume(c, s.name(), "first")
    consume(c, s.name(), "second")
    publish_all(c, s.name(), b"1", b"2", b"3")
    deliveries(c, 3)
    c.call(1, m.BasicCancel(consumer_tag="first"))
    c.publish(1, "", s.name(), b"4")
    deliveries(c, 1)
    depth(c, s.name())


# basic.ack, basic.nack, basic.reject


def _unknown_tag(kind: str):  # type: ignore[no-untyped-def]
    def run(s: Session) -> None:
        c = s.channel()
        declare(c, s.name())
        publish_all(c, s.name(), b"a")
        c.sync(1)
        get(c, s.name())
        if kind == "ack":
            c.send(1, m.BasicAck(delivery_tag=5))  # type: ignore[arg-type]
        elif kind == "nack":
            c.send(1, m.BasicNack(delivery_tag=5))  # type: ignore[arg-type]
        else:
            c.send(1, m.BasicReject(delivery_tag=5))  # type: ignore[arg-type]
        c.sync(1)
        c.open(1)
        depth(c, s.name())

    return run


for _kind in ("ack", "nack", "reject"):
    scenario(f"basic.{_kind} of an unknown delivery tag closes the channel 406")(
        _unknown_tag(_kind)
    )


@scenario("basic.ack twice of one delivery tag closes the channel 406")
def _double_ack(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    publish_all(c, s.name(), b"a", b"b")
    c.sync(1)
    get(c, s.name())
    ack(c, 1)
    ack(c, 1)
    c.sync(1)


@scenario("basic.ack multiple settles up to the tag and leaves the rest")
def _ack_multiple(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "t")
    publish_all(c, s.name(), b"1", b"2", b"3", b"4")
    deliveries(c, 4)
    ack(c, 3, multiple=True)
    c.sync(1)
    c.call(1, m.BasicCancel(consumer_tag="t"))
    reopen_and_count(c, s.name())


@scenario("basic.ack multiple with tag 0 settles every delivery")
def _ack_all(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "t")
    publish_all(c, s.name(), b"1", b"2", b"3")
    deliveries(c, 3)
    ack(c, 0, multiple=True)
    c.sync(1)
    c.call(1, m.BasicCancel(consumer_tag="t"))
    reopen_and_count(c, s.name())


@scenario("basic.ack of tag 0 without multiple closes the channel 406")
def _ack_zero(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    publish_all(c, s.name(), b"1")
    c.sync(1)
    get(c, s.name())
    ack(c, 0)
    c.sync(1)


@scenario("basic.nack multiple with requeue redelivers them in order")
def _nack_multiple(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    consume(c, s.name(), "t")
    publish_all(c, s.name(), b"1", b"2", b"3")
    deliveries(c, 3)
    c.send(1, m.BasicNack(delivery_tag=2, multiple=True, requeue=True))  # type: ignore[arg-type]
    deliveries(c, 2)
    c.send(1, m.BasicNack(delivery_tag=0, multiple=True, requeue=False))  # type: ignore[arg-type]
    c.sync(1)
    c.call(1, m.BasicCancel(consumer_tag="t"))
    depth(c, s.name())


@scenario("basic.nack without requeue and without a dead-letter exchange drops it")
def _nack_drop(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    publish_all(c, s.name(), b"1", b"2")
    c.sync(1)
    get(c, s.name())
    c.send(1, m.BasicNack(delivery_tag=1, requeue=False))  # type: ignore[arg-type]
    c.sync(1)
    reopen_and_count(c, s.name())


def _dead_letter(how: str):  # type: ignore[no-untyped-def]
    def run(s: Session) -> None:
        c = s.channel()
        declare(c, s.name("dlq"))
        declare(
            c,
            s.name(),
            **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": s.name("dlq")},
        )
        properties = BasicProperties(headers={"mine": "kept"}, expiration="60000")
        c.publish(1, "", s.name(), b"dead", properties)
        c.sync(1)
        get(c, s.name())
        if how == "reject":
            c.send(1, m.BasicReject(delivery_tag=1, requeue=False))  # type: ignore[arg-type]
        else:
            c.send(1, m.BasicNack(delivery_tag=1, requeue=False))  # type: ignore[arg-type]
        c.sync(1)
        get(c, s.name("dlq"), no_ack=True)
        get(c, s.name(), no_ack=True)

    return run


for _how in ("reject", "nack"):
    scenario(f"basic.{_how} requeue=false dead-letters with x-death")(_dead_letter(_how))


@scenario("basic.reject twice by dead-lettering back: x-death counts")
def _dead_letter_twice(s: Session) -> None:
    c = s.channel()
    for queue, target in (("a", "b"), ("b", "a")):
        declare(
            c,
            s.name(queue),
            **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": s.name(target)},
        )
    c.publish(1, "", s.name("a"), b"bounce")
    c.sync(1)
    for tag, queue in ((1, "a"), (2, "b"), (3, "a")):
        get(c, s.name(queue))
        c.send(1, m.BasicReject(delivery_tag=tag, requeue=False))  # type: ignore[arg-type]
        c.sync(1)
    get(c, s.name("b"), no_ack=True)


# basic.recover


def _recover(method: str, requeue: bool):  # type: ignore[no-untyped-def]
    def run(s: Session) -> None:
        c = s.channel()
        declare(c, s.name())
        consume(c, s.name(), "t")
        publish_all(c, s.name(), b"1", b"2")
        deliveries(c, 2)
        if method == "recover":
            c.send(1, m.BasicRecover(requeue=requeue))
            c.expect(3, "basic.recover-ok", "basic.deliver")
        else:
            c.send(1, m.BasicRecoverAsync(requeue=requeue))
            deliveries(c, 2)
        ack(c, 0, multiple=True)
        c.sync(1)

    return run


for _method in ("recover", "recover-async"):
    for _requeue in (True, False):
        scenario(f"basic.{_method} requeue={_requeue} with a consumer")(_recover(_method, _requeue))


@scenario("basic.recover with nothing unacked answers recover-ok")
def _recover_nothing(s: Session) -> None:
    c = s.channel()
    c.call(1, m.BasicRecover(requeue=True))
