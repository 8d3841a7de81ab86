"""The tx class: what a transaction holds back until commit (publishes, acks, nacks,
rejects, returns), what rollback discards or gives back, and the 406s of tx methods on a
channel that is not transactional or is confirming."""

from __future__ import annotations

from amqp_gateway.codec import methods as m
from tests.differential.harness import Conn, Session, scenario
from tests.differential.scenarios.basic import declare, depth, get
from tests.differential.scenarios.consumers import ack, consume, reopen_and_count


def transactional(s: Session) -> Conn:
    c = s.channel()
    c.call(1, m.TxSelect())
    return c


@scenario("tx.select twice answers both, commit with nothing pending answers")
def _select_twice(s: Session) -> None:
    c = transactional(s)
    c.call(1, m.TxSelect())
    c.call(1, m.TxCommit())
    c.call(1, m.TxRollback())


@scenario("tx.commit makes the publishes visible, not before")
def _commit_publishes(s: Session) -> None:
    c = transactional(s)
    declare(c, s.name())
    for body in (b"1", b"2"):
        c.publish(1, "", s.name(), body)
    c.sync(1)
    depth(c, s.name())
    get(c, s.name(), no_ack=True)
    c.call(1, m.TxCommit())
    depth(c, s.name())
    get(c, s.name(), no_ack=True)


@scenario("tx.rollback discards the publishes; later ones commit")
def _rollback_publishes(s: Session) -> None:
    c = transactional(s)
    declare(c, s.name())
    c.publish(1, "", s.name(), b"discarded")
    c.call(1, m.TxRollback())
    c.publish(1, "", s.name(), b"kept")
    c.call(1, m.TxCommit())
    depth(c, s.name())
    get(c, s.name(), no_ack=True)


@scenario("tx.commit delivers to a consumer of the same channel")
def _commit_to_consumer(s: Session) -> None:
    c = transactional(s)
    declare(c, s.name())
    consume(c, s.name(), "t", no_ack=True)
    c.publish(1, "", s.name(), b"after commit")
    c.sync(1)
    c.call(1, m.TxCommit())  # both brokers deliver before the commit-ok (logged here)
    c.quiet()  # and nothing after it


@scenario("tx.rollback of an ack leaves the message unacked")
def _rollback_ack(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    for body in (b"1", b"2"):
        c.publish(1, "", s.name(), body)
    c.sync(1)
    get(c, s.name())
    get(c, s.name())
    c.call(1, m.TxSelect())
    ack(c, 1)
    c.call(1, m.TxRollback())
    ack(c, 2)
    c.call(1, m.TxCommit())
    reopen_and_count(c, s.name())
    get(c, s.name(), no_ack=True)


@scenario("tx.rollback of an ack, then the same ack committed")
def _rollback_then_ack(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.publish(1, "", s.name(), b"1")
    c.sync(1)
    get(c, s.name())
    c.call(1, m.TxSelect())
    ack(c, 1)
    c.call(1, m.TxRollback())
    ack(c, 1)
    c.call(1, m.TxCommit())
    reopen_and_count(c, s.name())


@scenario("tx: an ack twice in one transaction closes the channel 406")
def _double_ack_in_tx(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.publish(1, "", s.name(), b"1")
    c.sync(1)
    get(c, s.name())
    c.call(1, m.TxSelect())
    ack(c, 1)
    ack(c, 1)
    c.sync(1)


@scenario("tx.commit applies nack and reject with requeue")
def _commit_nack_reject(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    for body in (b"1", b"2", b"3"):
        c.publish(1, "", s.name(), body)
    c.sync(1)
    for _ in range(3):
        get(c, s.name())
    c.call(1, m.TxSelect())
    c.send(1, m.BasicNack(delivery_tag=1, requeue=True))  # type: ignore[arg-type]
    c.send(1, m.BasicReject(delivery_tag=2, requeue=False))  # type: ignore[arg-type]
    c.sync(1)
    depth(c, s.name())
    c.call(1, m.TxCommit())
    depth(c, s.name())
    get(c, s.name())


@scenario("tx: a mandatory unroutable publish is returned at commit")
def _return_at_commit(s: Session) -> None:
    c = transactional(s)
    c.publish(1, "amq.direct", s.name("nowhere"), b"back", mandatory=True)
    c.sync(1)
    c.call(1, m.TxCommit())
    c.sync(1)


@scenario("tx: a publish to a missing exchange is refused 404")
def _missing_exchange(s: Session) -> None:
    c = transactional(s)
    c.publish(1, s.name("missing"), "k", b"x")
    c.sync(1)
    c.open(1)
    c.call(1, m.TxCommit())


@scenario("tx: closing the channel discards the uncommitted publishes")
def _close_discards(s: Session) -> None:
    c = transactional(s)
    declare(c, s.name())
    c.publish(1, "", s.name(), b"lost")
    c.sync(1)
    reopen_and_count(c, s.name())


for _method in ("commit", "rollback"):

    def _not_transactional(s: Session, method: str = _method) -> None:
        c = s.channel()
        c.call(1, m.TxCommit() if method == "commit" else m.TxRollback())
        c.open(1)
        c.call(1, m.TxSelect())

    scenario(f"tx.{_method} without tx.select closes the channel 406")(_not_transactional)


@scenario("tx: confirm.select with publishes pending is refused and discards them")
def _confirm_on_tx(s: Session) -> None:
    c = transactional(s)
    declare(c, s.name())
    c.publish(1, "", s.name(), b"pending")
    c.send(1, m.ConfirmSelect(nowait=True))
    c.sync(1)
    c.open(1)
    depth(c, s.name())


@scenario("tx: tx.select after confirm.select nowait is refused 406")
def _tx_on_confirm(s: Session) -> None:
    c = s.channel()
    c.send(1, m.ConfirmSelect(nowait=True))
    declare(c, s.name())
    c.publish(1, "", s.name(), b"confirmed")
    c.confirms(1, 1)
    c.call(1, m.TxSelect())


@scenario("tx: the route is taken at publish, not at commit")
def _route_at_publish(s: Session) -> None:
    c = transactional(s)
    declare(c, s.name("late"))
    declare(c, s.name("gone"))
    c.call(1, m.QueueBind(queue=s.name("gone"), exchange="amq.direct", routing_key="k"))
    c.publish(1, "amq.direct", "k", b"routed early")
    c.sync(1)
    c.call(1, m.QueueBind(queue=s.name("late"), exchange="amq.direct", routing_key="k"))
    c.call(1, m.QueueUnbind(queue=s.name("gone"), exchange="amq.direct", routing_key="k"))
    c.call(1, m.TxCommit())
    depth(c, s.name("late"))
    depth(c, s.name("gone"))


@scenario("tx: a publish to an internal exchange is refused at publish")
def _internal_in_tx(s: Session) -> None:
    c = transactional(s)
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout", internal=True))
    c.publish(1, s.name("x"), "", b"inside")
    c.sync(1)
    c.open(1)
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))


@scenario("tx: closing the channel requeues what the open transaction acked")
def _close_with_acks(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.publish(1, "", s.name(), b"1")
    c.sync(1)
    get(c, s.name())
    c.call(1, m.TxSelect())
    ack(c, 1)
    c.sync(1)
    reopen_and_count(c, s.name())
    get(c, s.name(), no_ack=True)
