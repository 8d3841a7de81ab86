"""Publisher confirms: which publish is acked and which nacked, and what comes with it
(returns, channel closes, queue counts), in confirm mode on raw connections."""

from __future__ import annotations

from collections.abc import Callable

from amqp_gateway.codec import BasicProperties
from amqp_gateway.codec import methods as m
from tests.differential.harness import REPLY_TIMEOUT_S, Conn, Session, scenario
from tests.differential.wire import Observation


def _confirming(s: Session, channel: int = 1, conn: Conn | None = None) -> Conn:
    """A connection with `channel` open and in confirm mode."""
    c = s.channel(channel, conn)
    c.call(channel, m.ConfirmSelect())
    return c


def _forget_multiple(s: Session) -> None:
    """Drops `multiple` from the confirm just logged: for the first tag, multiple or not
    means the same, and brokers choose differently."""
    *head, fields = s.log.pop()
    s.log.append((*head, {"delivery_tag": fields["delivery_tag"]}))


def _settle(c: Conn, last_tags: dict[int, int]) -> None:
    """`Conn.confirms` for several channels at once, whose confirms interleave as they
    will: reads until every channel's publishes up to its last tag are settled."""
    states = {ch: c.session.confirmed.setdefault((c.number, ch), {}) for ch in last_tags}

    def settled() -> bool:
        return all(
            all(t in states[ch] for t in range(1, last + 1)) for ch, last in last_tags.items()
        )

    def done(o: Observation) -> bool:
        if o[1] in states and o[2] in ("basic.ack", "basic.nack"):
            tag, multiple = o[3]["delivery_tag"], o[3]["multiple"]
            for tag_settled in range(1 if multiple else tag, tag + 1):
                states[o[1]].setdefault(tag_settled, o[2])
            c.session.log.pop()  # compared per tag, at the end of the run
            return settled()
        return o[2] in ("connection.close", "channel.close")

    c._read_until(done, REPLY_TIMEOUT_S)


def _count(c: Conn, queue: str, channel: int = 1) -> None:
    """Logs the queue's message count (its passive declare-ok)."""
    c.call(channel, m.QueueDeclare(queue=queue, passive=True))


@scenario("confirm: publishes to a queue are acked")
def _acked(s: Session) -> None:
    c = _confirming(s)
    c.call(1, m.QueueDeclare(queue=s.name()))
    for body in (b"a", b"b", b"c"):
        c.publish(1, "", s.name(), body)
    c.confirms(1, 3)
    _count(c, s.name())


@scenario("confirm: an unroutable publish without mandatory is acked")
def _unroutable(s: Session) -> None:
    c = _confirming(s)
    c.publish(1, "amq.direct", s.name("nowhere"))
    c.publish(1, "", s.name("no-such-queue"))
    c.confirms(1, 2)
    c.quiet()


@scenario("confirm: an unroutable mandatory publish is returned, then acked")
def _unroutable_mandatory(s: Session) -> None:
    c = _confirming(s)
    c.publish(1, "amq.direct", s.name("nowhere"), b"back", mandatory=True)
    # Read by hand so that the order of return and ack is compared too.
    c.expect(1, "basic.ack", "basic.nack")
    _forget_multiple(s)


@scenario("confirm: a publish to a missing exchange closes the channel")
def _missing_exchange(s: Session) -> None:
    c = _confirming(s)
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.publish(1, "", s.name())
    c.publish(1, s.name("missing-x"), "k")
    c.sync(1)
    c.open(1)
    c.call(1, m.ConfirmSelect())
    c.publish(1, "", s.name())
    c.confirms(1, 1)
    _count(c, s.name())


def _limited(overflow: str, **extra: object) -> dict[str, object]:
    return {"x-max-length": 1, "x-overflow": overflow, **extra}


@scenario("confirm: x-overflow reject-publish nacks what the full queue refuses")
def _reject_publish(s: Session) -> None:
    c = _confirming(s)
    c.call(1, m.QueueDeclare(queue=s.name(), arguments=_limited("reject-publish")))
    for body in (b"a", b"b", b"c"):
        c.publish(1, "", s.name(), body)
    c.confirms(1, 3)
    c.call(1, m.BasicGet(queue=s.name(), no_ack=True))
    c.publish(1, "", s.name(), b"d")
    c.confirms(1, 4)
    c.call(1, m.BasicGet(queue=s.name(), no_ack=True))


@scenario("confirm: x-max-length-bytes reject-publish nacks a body that does not fit")
def _reject_publish_bytes(s: Session) -> None:
    c = _confirming(s)
    arguments = {"x-max-length-bytes": 10, "x-overflow": "reject-publish"}
    c.call(1, m.QueueDeclare(queue=s.name(), arguments=arguments))
    c.publish(1, "", s.name(), b"12345678")
    c.publish(1, "", s.name(), b"123")
    c.publish(1, "", s.name(), b"12")
    c.confirms(1, 3)
    _count(c, s.name())


@scenario("confirm: x-overflow reject-publish-dlx nacks and dead-letters the refused")
def _reject_publish_dlx(s: Session) -> None:
    c = _confirming(s)
    c.call(1, m.QueueDeclare(queue=s.name("dlq")))
    arguments = _limited(
        "reject-publish-dlx",
        **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": s.name("dlq")},
    )
    c.call(1, m.QueueDeclare(queue=s.name(), arguments=arguments))
    for body in (b"a", b"b", b"c"):
        c.publish(1, "", s.name(), body)
    c.confirms(1, 3)
    _count(c, s.name())
    c.call(1, m.BasicGet(queue=s.name("dlq"), no_ack=True))
    c.call(1, m.BasicGet(queue=s.name("dlq"), no_ack=True))


@scenario("confirm: x-overflow drop-head acks every publish and keeps the newest")
def _drop_head(s: Session) -> None:
    c = _confirming(s)
    c.call(1, m.QueueDeclare(queue=s.name(), arguments=_limited("drop-head")))
    for body in (b"a", b"b", b"c"):
        c.publish(1, "", s.name(), body)
    c.confirms(1, 3)
    c.call(1, m.BasicGet(queue=s.name(), no_ack=True))
    c.call(1, m.BasicGet(queue=s.name(), no_ack=True))


@scenario("confirm: an unroutable publish after a refused one is acked")
def _unroutable_after_refused(s: Session) -> None:
    c = _confirming(s)
    c.call(1, m.QueueDeclare(queue=s.name(), arguments=_limited("reject-publish")))
    c.publish(1, "", s.name(), b"kept")
    c.publish(1, "", s.name(), b"refused")
    c.publish(1, "amq.direct", s.name("nowhere"), b"unroutable")
    c.publish(1, "", s.name("no-such-queue"), b"unroutable")
    c.confirms(1, 4)


@scenario("confirm: a mandatory publish refused by a full queue is nacked, not returned")
def _mandatory_refused(s: Session) -> None:
    c = _confirming(s)
    c.call(1, m.QueueDeclare(queue=s.name(), arguments=_limited("reject-publish")))
    c.publish(1, "", s.name(), b"kept", mandatory=True)
    c.publish(1, "", s.name(), b"refused", mandatory=True)
    c.confirms(1, 2)
    c.quiet()


@scenario("confirm: a fanout to two queues, one full, nacks and still enqueues on the other")
def _fanout_one_full(s: Session) -> None:
    c = _confirming(s)
    x = s.name("x")
    c.call(1, m.ExchangeDeclare(exchange=x, type="fanout"))
    c.call(1, m.QueueDeclare(queue=s.name("full"), arguments=_limited("reject-publish")))
    c.call(1, m.QueueDeclare(queue=s.name("open")))
    for queue in (s.name("full"), s.name("open")):
        c.call(1, m.QueueBind(queue=queue, exchange=x))
    for body in (b"a", b"b", b"c"):
        c.publish(1, x, "", body)
    c.confirms(1, 3)
    _count(c, s.name("full"))
    _count(c, s.name("open"))


@scenario("confirm: confirm.select twice answers both")
def _select_twice(s: Session) -> None:
    c = _confirming(s)
    c.call(1, m.ConfirmSelect())
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.publish(1, "", s.name())
    c.confirms(1, 1)


@scenario("confirm: confirm.select nowait sends no select-ok, and confirms start at 1")
def _select_nowait(s: Session) -> None:
    c = s.channel()
    c.send(1, m.ConfirmSelect(nowait=True))
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.publish(1, "", s.name())
    c.publish(1, "", s.name())
    c.confirms(1, 2)


@scenario("confirm: two channels number their confirms each from 1")
def _two_channels(s: Session) -> None:
    c = _confirming(s, 1)
    _confirming(s, 2, c)
    c.call(1, m.QueueDeclare(queue=s.name()))
    for channel in (1, 2, 1, 2, 2):
        c.publish(channel, "", s.name(), str(channel).encode())
    _settle(c, {1: 2, 2: 3})
    _count(c, s.name())


@scenario("confirm: a channel reopened after a close numbers confirms from 1 again")
def _reopened(s: Session) -> None:
    c = _confirming(s)
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.publish(1, "", s.name())
    c.publish(1, "", s.name())
    c.confirms(1, 2)
    c.call(1, m.ChannelClose(reply_code=200, reply_text="done"))
    c.open(2)
    c.call(2, m.ConfirmSelect())
    c.publish(2, "", s.name())
    c.confirms(2, 1)


@scenario("confirm: persistent messages to a durable queue are acked and kept")
def _persistent(s: Session) -> None:
    c = _confirming(s)
    c.call(1, m.QueueDeclare(queue=s.name(), durable=True))
    persistent = BasicProperties(delivery_mode=2, content_type="text/plain")
    for body in (b"one", b"two"):
        c.publish(1, "", s.name(), body, persistent)
    c.confirms(1, 2)
    c.call(1, m.BasicGet(queue=s.name(), no_ack=True))
    c.call(1, m.QueueDelete(queue=s.name()))


@scenario("confirm: confirm.select on a transactional channel is refused")
def _select_in_tx(s: Session) -> None:
    c = s.channel()
    c.call(1, m.TxSelect())
    c.call(1, m.ConfirmSelect())


@scenario("confirm: tx.select on a confirming channel is refused")
def _tx_in_confirm(s: Session) -> None:
    c = _confirming(s)
    c.call(1, m.TxSelect())


def _via_alternate(full: bool) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = _confirming(s)
        x, ae = s.name("x"), s.name("ae")
        c.call(1, m.ExchangeDeclare(exchange=ae, type="fanout"))
        c.call(1, m.ExchangeDeclare(exchange=x, arguments={"alternate-exchange": ae}))
        arguments = _limited("reject-publish") if full else {}
        c.call(1, m.QueueDeclare(queue=s.name(), arguments=arguments))
        c.call(1, m.QueueBind(queue=s.name(), exchange=ae))
        for body in (b"a", b"b"):
            c.publish(1, x, "unbound", body, mandatory=True)
        c.confirms(1, 2)
        _count(c, s.name())

    return run


for _full, _kind in ((False, "plain"), (True, "full")):
    scenario(f"confirm: mandatory publishes through an alternate exchange to a {_kind} queue")(
        _via_alternate(_full)
    )
