"""When queues and exchanges end on their own: exclusive queues with their connection,
auto-delete queues with their last consumer, auto-delete exchanges with their last
binding; and how an exclusive queue refuses other connections meanwhile.

RabbitMQ deletes an exclusive or auto-delete queue in the queue's own process after it
has answered (close-ok, cancel-ok), so a client may still see the queue for a moment.
`await_deletion` asks again until the queue is gone, keeping only the final answer:
the scenario compares whether and how it ends, not how many round trips that took.
"""

from __future__ import annotations

from collections.abc import Callable

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from tests.differential.harness import Conn, Session, scenario

POLLS_MAX = 500  # round trips before a deletion counts as never happening
POLL_CHANNEL = 9


def await_deletion(s: Session, c: Conn, passive: codec.Method) -> None:
    """Repeat the passive declare `passive` on channel 9 of `c` until the broker answers
    404; only that answer (or the last one, if none came) stays in the log."""
    mark = len(s.log)
    is_open = False
    for _ in range(POLLS_MAX):
        if not is_open:
            c.open(POLL_CHANNEL)
            is_open = True
        reply = c.call(POLL_CHANNEL, passive)
        if reply[2] == "channel.close":
            is_open = False
            if reply[3]["reply_code"] == 404:
                break
    s.log[mark:] = s.log[-1:]
    if is_open:
        c.call(POLL_CHANNEL, m.ChannelClose(reply_code=200))
        del s.log[-1]


def _passive_queue(s: Session) -> m.QueueDeclare:
    return m.QueueDeclare(queue=s.name(), passive=True)


# Exclusive queues.
@scenario("exclusive queue is deleted when its connection closes")
def _exclusive_connection_close(s: Session) -> None:
    owner = s.channel()
    observer = s.channel(1, s.connect())
    owner.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))
    owner.call(1, m.QueueBind(queue=s.name(), exchange="amq.fanout"))
    owner.close()
    await_deletion(s, observer, _passive_queue(s))


@scenario("exclusive queue survives its channel's close")
def _exclusive_channel_close(s: Session) -> None:
    owner = s.channel()
    owner.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))
    owner.call(1, m.ChannelClose(reply_code=200))
    owner.open(2)
    owner.call(2, m.QueueDeclare(queue=s.name(), passive=True))
    owner.call(2, m.QueueDelete(queue=s.name()))


@scenario("durable exclusive queue is deleted when its connection closes")
def _exclusive_durable(s: Session) -> None:
    owner = s.channel()
    observer = s.channel(1, s.connect())
    owner.call(1, m.QueueDeclare(queue=s.name(), exclusive=True, durable=True))
    owner.publish(1, "", s.name(), b"kept?")
    owner.close()
    await_deletion(s, observer, _passive_queue(s))


def _locked(use: Callable[[Session], codec.Method]) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        owner = s.channel()
        owner.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))
        other = s.channel(1, s.connect())
        other.call(1, use(s))
        owner.call(1, m.QueueDeclare(queue=s.name(), passive=True))

    return run


_LOCKED_USES: dict[str, Callable[[Session], codec.Method]] = {
    "passive declare": lambda s: m.QueueDeclare(queue=s.name(), passive=True),
    "declare": lambda s: m.QueueDeclare(queue=s.name()),
    "exclusive declare": lambda s: m.QueueDeclare(queue=s.name(), exclusive=True),
    "consume": lambda s: m.BasicConsume(queue=s.name()),
    "get": lambda s: m.BasicGet(queue=s.name()),
    "bind": lambda s: m.QueueBind(queue=s.name(), exchange="amq.direct", routing_key="k"),
    "unbind of a missing binding": lambda s: m.QueueUnbind(
        queue=s.name(), exchange="amq.direct", routing_key="k"
    ),
    "purge": lambda s: m.QueuePurge(queue=s.name()),
    "delete": lambda s: m.QueueDelete(queue=s.name()),
}

for _what, _use in _LOCKED_USES.items():
    scenario(f"exclusive queue of another connection: {_what}")(_locked(_use))


@scenario("exclusive queue of another connection: unbind of an existing binding")
def _locked_unbind_bound(s: Session) -> None:
    owner = s.channel()
    owner.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))
    owner.call(1, m.QueueBind(queue=s.name(), exchange="amq.direct", routing_key="k"))
    other = s.channel(1, s.connect())
    other.call(1, m.QueueUnbind(queue=s.name(), exchange="amq.direct", routing_key="k"))
    owner.publish(1, "amq.direct", "k", b"bound?")
    owner.call(1, m.BasicGet(queue=s.name(), no_ack=True))


@scenario("exclusive queue of another connection still takes publishes")
def _locked_publish(s: Session) -> None:
    owner = s.channel()
    owner.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))
    other = s.channel(1, s.connect())
    other.publish(1, "", s.name(), b"from another connection")
    other.sync(1)
    owner.call(1, m.BasicGet(queue=s.name(), no_ack=True))


# Auto-delete queues.
def _consume_auto_delete(s: Session, c: Conn) -> None:
    c.call(1, m.QueueDeclare(queue=s.name(), auto_delete=True))
    c.call(1, m.BasicConsume(queue=s.name(), consumer_tag="ctag"))


@scenario("auto-delete queue is deleted when its last consumer cancels")
def _auto_delete_cancel(s: Session) -> None:
    c = s.channel()
    _consume_auto_delete(s, c)
    c.call(1, m.BasicCancel(consumer_tag="ctag"))
    await_deletion(s, c, _passive_queue(s))


@scenario("auto-delete queue is deleted when its consumer's channel closes")
def _auto_delete_channel(s: Session) -> None:
    c = s.channel()
    _consume_auto_delete(s, c)
    c.call(1, m.ChannelClose(reply_code=200))
    await_deletion(s, c, _passive_queue(s))


@scenario("auto-delete queue is deleted when its consumer's connection closes")
def _auto_delete_connection(s: Session) -> None:
    c = s.channel()
    observer = s.channel(1, s.connect())
    _consume_auto_delete(s, c)
    c.close()
    await_deletion(s, observer, _passive_queue(s))


@scenario("auto-delete queue stays while one of two consumers remains")
def _auto_delete_two(s: Session) -> None:
    c = s.channel()
    _consume_auto_delete(s, c)
    c.call(1, m.BasicConsume(queue=s.name(), consumer_tag="second"))
    c.call(1, m.BasicCancel(consumer_tag="ctag"))
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))
    c.call(1, m.BasicCancel(consumer_tag="second"))
    await_deletion(s, c, _passive_queue(s))


@scenario("auto-delete queue that never had a consumer stays")
def _auto_delete_never(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name(), auto_delete=True))
    c.publish(1, "", s.name(), b"kept")
    c.call(1, m.BasicGet(queue=s.name()))
    c.call(1, m.ChannelClose(reply_code=200))
    c.open(1)
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))
    c.call(1, m.QueueDelete(queue=s.name()))


@scenario("auto-delete queue: basic.get is not a consumer")
def _auto_delete_get(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name(), auto_delete=True))
    c.call(1, m.BasicGet(queue=s.name()))
    c.call(1, m.BasicConsume(queue=s.name(), consumer_tag="ctag"))
    c.call(1, m.BasicCancel(consumer_tag="ctag"))
    await_deletion(s, c, _passive_queue(s))


# Auto-delete exchanges.
def _passive_exchange(s: Session) -> m.ExchangeDeclare:
    return m.ExchangeDeclare(exchange=s.name("x"), passive=True)


@scenario("auto-delete exchange is deleted when its last queue binding goes")
def _auto_delete_exchange(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="direct", auto_delete=True))
    c.call(1, m.QueueDeclare(queue=s.name()))
    for key in ("a", "b"):
        c.call(1, m.QueueBind(queue=s.name(), exchange=s.name("x"), routing_key=key))
    c.call(1, m.QueueUnbind(queue=s.name(), exchange=s.name("x"), routing_key="a"))
    c.call(1, _passive_exchange(s))
    c.call(1, m.QueueUnbind(queue=s.name(), exchange=s.name("x"), routing_key="b"))
    await_deletion(s, c, _passive_exchange(s))
    c.call(1, m.QueueDelete(queue=s.name()))


@scenario("auto-delete exchange is deleted when its bound queue is deleted")
def _auto_delete_exchange_queue(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout", auto_delete=True))
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.call(1, m.QueueBind(queue=s.name(), exchange=s.name("x")))
    c.call(1, m.QueueDelete(queue=s.name()))
    await_deletion(s, c, _passive_exchange(s))


@scenario("auto-delete exchange that never had a binding stays")
def _auto_delete_exchange_never(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout", auto_delete=True))
    c.publish(1, s.name("x"), "", b"nowhere")
    c.call(1, _passive_exchange(s))
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))


@scenario("auto-delete exchange as a binding's source and destination")
def _auto_delete_exchange_e2e(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("src"), type="fanout", auto_delete=True))
    c.call(1, m.ExchangeDeclare(exchange=s.name("dst"), type="fanout", auto_delete=True))
    c.call(1, m.ExchangeBind(destination=s.name("dst"), source=s.name("src")))
    c.call(1, m.ExchangeUnbind(destination=s.name("dst"), source=s.name("src")))
    # The source lost its last binding; the destination never had one as a source.
    c.call(1, m.ExchangeDeclare(exchange=s.name("dst"), passive=True))
    await_deletion(s, c, m.ExchangeDeclare(exchange=s.name("src"), passive=True))
    c.call(1, m.ExchangeDelete(exchange=s.name("dst")))


@scenario("auto-delete exchange deleted by the exclusive queue of a closed connection")
def _auto_delete_exchange_exclusive(s: Session) -> None:
    owner = s.channel()
    observer = s.channel(1, s.connect())
    owner.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout", auto_delete=True))
    owner.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))
    owner.call(1, m.QueueBind(queue=s.name(), exchange=s.name("x")))
    owner.close()
    await_deletion(s, observer, _passive_queue(s))
    await_deletion(s, observer, _passive_exchange(s))
