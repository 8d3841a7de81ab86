"""The queue class (declare, bind, unbind, purge, delete): flags, arguments and their
validation, the counts in the replies, and every error RabbitMQ answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from amqp_gateway.codec import methods as m
from tests.differential.harness import Session, scenario
from tests.differential.scenarios.exchange import call_reopen, drain


@scenario("queue.declare server-named, then the empty name means the last one")
def _server_named(s: Session) -> None:
    c = s.channel()
    name = c.call(1, m.QueueDeclare(queue="", exclusive=True))[3]["queue"]
    c.call(1, m.QueueBind(queue="", exchange="amq.direct", routing_key=""))
    c.publish(1, "amq.direct", "", b"empty key")
    c.publish(1, "amq.direct", name, b"queue name as key")
    c.call(1, m.BasicGet(queue="", no_ack=True))
    c.call(1, m.QueuePurge(queue=""))
    c.call(1, m.QueueUnbind(queue="", exchange="amq.direct", routing_key=""))
    c.call(1, m.QueueDelete(queue=""))


@scenario("queue.declare server-named twice gives two queues")
def _server_named_twice(s: Session) -> None:
    c = s.channel()
    first = c.call(1, m.QueueDeclare(queue="", exclusive=True))[3]["queue"]
    second = c.call(1, m.QueueDeclare(queue="", exclusive=True))[3]["queue"]
    s.record("distinct", first != second)
    c.call(1, m.QueueDeclare(queue=first, passive=True))


@scenario("queue.declare passive with an empty name and no queue before")
def _empty_name_no_previous(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue="", passive=True))


def _empty_name_use(method: m.Method) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel()
        c.call(1, method)

    return run


for _method in (
    m.QueueBind(queue="", exchange="amq.direct", routing_key="k"),
    m.QueueUnbind(queue="", exchange="amq.direct", routing_key="k"),
    m.QueuePurge(queue=""),
    m.QueueDelete(queue=""),
    m.BasicGet(queue=""),
    m.BasicConsume(queue=""),
):
    scenario(f"{_method.NAME} with an empty name and no queue declared before")(
        _empty_name_use(_method)
    )


def _flags(durable: bool, exclusive: bool, auto_delete: bool) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel()
        declare = m.QueueDeclare(
            queue=s.name(), durable=durable, exclusive=exclusive, auto_delete=auto_delete
        )
        c.call(1, declare)
        c.call(1, declare)
        c.call(1, m.QueueDeclare(queue=s.name(), passive=True))
        other = s.channel(1, s.connect())
        other.call(1, m.QueueDeclare(queue=s.name(), passive=True))
        c.call(1, m.QueueDelete(queue=s.name()))

    return run


for _durable in (False, True):
    for _exclusive in (False, True):
        for _auto_delete in (False, True):
            scenario(
                f"queue.declare durable={_durable} exclusive={_exclusive} "
                f"auto_delete={_auto_delete}"
            )(_flags(_durable, _exclusive, _auto_delete))


_REDECLARES: dict[str, tuple[m.QueueDeclare, m.QueueDeclare]] = {
    "durable": (m.QueueDeclare(durable=False), m.QueueDeclare(durable=True)),
    "durable off": (m.QueueDeclare(durable=True), m.QueueDeclare(durable=False)),
    "auto_delete": (m.QueueDeclare(auto_delete=False), m.QueueDeclare(auto_delete=True)),
    "exclusive": (m.QueueDeclare(exclusive=False), m.QueueDeclare(exclusive=True)),
    "exclusive off": (m.QueueDeclare(exclusive=True), m.QueueDeclare(exclusive=False)),
    "added argument": (m.QueueDeclare(), m.QueueDeclare(arguments={"x-max-length": 10})),
    "removed argument": (m.QueueDeclare(arguments={"x-max-length": 10}), m.QueueDeclare()),
    "changed argument": (
        m.QueueDeclare(arguments={"x-message-ttl": 1000}),
        m.QueueDeclare(arguments={"x-message-ttl": 2000}),
    ),
    "argument type": (
        m.QueueDeclare(arguments={"x-dead-letter-exchange": "a"}),
        m.QueueDeclare(arguments={"x-dead-letter-exchange": b"a"}),
    ),
    "number type": (
        m.QueueDeclare(arguments={"x-max-length": 10}),
        m.QueueDeclare(arguments={"x-max-length": 10.0}),
    ),
    "unknown argument": (
        m.QueueDeclare(arguments={"x-foo": 1}),
        m.QueueDeclare(arguments={"x-foo": 2}),
    ),
    "queue type": (
        m.QueueDeclare(durable=True),
        m.QueueDeclare(durable=True, arguments={"x-queue-type": "quorum"}),
    ),
}


def _redeclare(first: m.QueueDeclare, second: m.QueueDeclare) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel()
        for declare in (first, second):
            call_reopen(c, replace(declare, queue=s.name()))
        c.call(1, m.QueueDeclare(queue=s.name(), passive=True))
        c.call(1, m.QueueDelete(queue=s.name()))

    return run


for _what, (_first, _second) in _REDECLARES.items():
    scenario(f"queue.declare again with a different {_what}")(_redeclare(_first, _second))


@scenario("queue.declare passive ignores flags and arguments")
def _passive_ignores(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name(), arguments={"x-max-length": 10}))
    c.call(
        1,
        m.QueueDeclare(
            queue=s.name(),
            passive=True,
            durable=True,
            auto_delete=True,
            arguments={"x-max-length": 5, "x-message-ttl": "bad"},
        ),
    )
    c.call(1, m.QueueDelete(queue=s.name()))


# Argument validation: each wrong value is a 406 with RabbitMQ's text.
_BAD_ARGUMENTS: tuple[tuple[str, object], ...] = (
    ("x-message-ttl", -1),
    ("x-message-ttl", "abc"),
    ("x-message-ttl", 1.5),
    ("x-message-ttl", 4294967296),
    ("x-message-ttl", True),
    ("x-expires", 0),
    ("x-expires", -5),
    ("x-expires", "soon"),
    ("x-expires", 4294967296),
    ("x-max-length", -1),
    ("x-max-length", "ten"),
    ("x-max-length-bytes", -1),
    ("x-max-in-memory-length", -1),
    ("x-max-in-memory-bytes", "big"),
    ("x-max-priority", 256),
    ("x-max-priority", -1),
    ("x-max-priority", "high"),
    ("x-overflow", "bogus"),
    ("x-overflow", 1),
    ("x-queue-type", "bogus"),
    ("x-queue-type", 1),
    ("x-queue-mode", "bogus"),
    ("x-queue-mode", 1),
    ("x-queue-version", 3),
    ("x-queue-version", "2"),
    ("x-max-age", "bogus"),
    ("x-stream-max-segment-size-bytes", -1),
    ("x-quorum-initial-group-size", 0),
    ("x-initial-cluster-size", -1),
    ("x-queue-leader-locator", "bogus"),
    ("x-delivery-limit", -1),
    ("x-dead-letter-exchange", 5),
    ("x-dead-letter-routing-key", "k"),
    ("x-dead-letter-routing-key", 5),
    ("x-dead-letter-exchange", b"dlx"),
    ("x-single-active-consumer", "yes"),
)


def _bad_argument(key: str, value: object) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel()
        call_reopen(c, m.QueueDeclare(queue=s.name(), arguments={key: value}))  # type: ignore[dict-item]  # plain field values
        call_reopen(c, m.QueueDeclare(queue=s.name(), passive=True))
        c.call(1, m.QueueDelete(queue=s.name()))

    return run


for _key, _value in _BAD_ARGUMENTS:
    scenario(f"queue.declare with {_key}={_value!r}")(_bad_argument(_key, _value))


@scenario("queue.declare with two bad arguments reports RabbitMQ's first")
def _two_bad_arguments(s: Session) -> None:
    c = s.channel()
    for arguments in (
        {"x-max-length": -1, "x-message-ttl": -1},
        {"x-queue-type": "bogus", "x-overflow": "bogus"},
        {"x-max-priority": 300, "x-expires": 0},
        {"x-dead-letter-exchange": 1, "x-message-ttl": "x"},
    ):
        call_reopen(c, m.QueueDeclare(queue=s.name(), arguments=arguments))  # type: ignore[arg-type]  # plain field values


_GOOD_ARGUMENTS: dict[str, dict[str, object]] = {
    "zero TTL and lengths, expiry 1": {
        "x-message-ttl": 0,
        "x-expires": 1,
        "x-max-length": 0,
        "x-max-length-bytes": 0,
    },
    "x-max-priority 255": {"x-max-priority": 255},
    "x-max-priority 0": {"x-max-priority": 0},
    "reject-publish-dlx, lazy, version 2": {
        "x-overflow": "reject-publish-dlx",
        "x-queue-mode": "lazy",
        "x-queue-version": 2,
    },
    "classic single active consumer": {
        "x-queue-type": "classic",
        "x-single-active-consumer": True,
    },
    "the default exchange as DLX": {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "k"},
    "unknown arguments, a long TTL": {"x-foo": "anything", "x-message-ttl": 4294967296},
}


def _good_arguments(arguments: dict[str, object]) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel()
        call_reopen(c, m.QueueDeclare(queue=s.name(), arguments=arguments))  # type: ignore[arg-type]  # plain field values
        call_reopen(c, m.QueueDeclare(queue=s.name(), arguments=arguments))  # type: ignore[arg-type]  # plain field values
        c.call(1, m.QueueDelete(queue=s.name()))

    return run


for _what, _arguments in _GOOD_ARGUMENTS.items():
    scenario(f"queue.declare accepts {_what}")(_good_arguments(_arguments))


@scenario("queue.declare exclusive and durable, again not durable")
def _exclusive_durable(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name(), exclusive=True, durable=True))
    call_reopen(c, m.QueueDeclare(queue=s.name(), exclusive=True, durable=False))
    call_reopen(c, m.QueueDeclare(queue=s.name(), exclusive=True, durable=True))
    c.call(1, m.QueueDelete(queue=s.name()))


def _refused_properties(kind: str) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel()
        for declare in (
            m.QueueDeclare(durable=True, exclusive=True, auto_delete=True),
            m.QueueDeclare(durable=False, exclusive=True),
            m.QueueDeclare(durable=True, exclusive=True),
            m.QueueDeclare(durable=False),
            # An argument the type refuses is reported before the properties.
            m.QueueDeclare(durable=False, arguments={"x-max-priority": 5}),
        ):
            arguments = {"x-queue-type": kind, **declare.arguments}
            call_reopen(c, replace(declare, queue=s.name(), arguments=arguments))

    return run


for _kind in ("quorum", "stream"):
    scenario(f"queue.declare of a {_kind} queue that is not durable, exclusive or auto-delete")(
        _refused_properties(_kind)
    )


@scenario("queue.declare of amq. names")
def _declare_amq(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue="amq." + s.name()))
    c.open(1)
    c.call(1, m.QueueDeclare(queue="amq." + s.name(), passive=True))
    c.open(1)
    c.call(1, m.QueueDeclare(queue="amq.gen-" + s.name(), exclusive=True))


@scenario("queue.declare nowait, with an error")
def _declare_nowait(s: Session) -> None:
    c = s.channel()
    c.send(1, m.QueueDeclare(queue=s.name(), nowait=True))
    c.sync(1)
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))
    c.send(1, m.QueueDeclare(queue=s.name(), durable=True, nowait=True))
    c.sync(1)
    c.open(1)
    c.send(1, m.QueueDelete(queue=s.name(), nowait=True))
    c.sync(1)
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))


@scenario("queue.declare-ok counts ready messages and consumers")
def _counts(s: Session) -> None:
    c = s.channel()
    s.channel(2, c)
    c.call(1, m.QueueDeclare(queue=s.name()))
    # RabbitMQ answers a declare ahead of publishes its queue has not taken in yet (its
    # stat call has priority), so the count is read after their confirms.
    c.call(1, m.ConfirmSelect())
    for body in (b"1", b"2", b"3"):
        c.publish(1, "", s.name(), body)
    c.confirms(1, 3)
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.call(2, m.BasicQos(prefetch_count=1))
    c.call(2, m.BasicConsume(queue=s.name(), consumer_tag="ctag"))
    c.expect(1, "basic.deliver")
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))
    c.call(1, m.BasicGet(queue=s.name()))
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.call(2, m.BasicCancel(consumer_tag="ctag"))
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))
    c.call(1, m.QueueDelete(queue=s.name()))


# queue.bind and queue.unbind.
@scenario("queue.bind of a missing queue or exchange")
def _bind_missing(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.call(1, m.ExchangeDeclare(exchange=s.name("x")))
    for queue, exchange in (("q", "nox"), ("noq", "x"), ("noq", "nox")):
        call_reopen(c, m.QueueBind(queue=s.name(queue), exchange=s.name(exchange)))
    c.call(1, m.QueueDelete(queue=s.name()))
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))


@scenario("queue.bind to the default exchange")
def _bind_default(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name()))
    call_reopen(c, m.QueueBind(queue=s.name(), exchange="", routing_key="k"))
    call_reopen(c, m.QueueBind(queue=s.name(), exchange="", routing_key=s.name()))
    call_reopen(c, m.QueueUnbind(queue=s.name(), exchange="", routing_key=s.name()))
    c.call(1, m.QueueDelete(queue=s.name()))


@scenario("queue.bind twice, unbind once")
def _bind_twice(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name()))
    for _ in range(2):
        c.call(1, m.QueueBind(queue=s.name(), exchange="amq.direct", routing_key=s.name()))
    c.publish(1, "amq.direct", s.name(), b"once")
    c.call(1, m.QueueUnbind(queue=s.name(), exchange="amq.direct", routing_key=s.name()))
    c.publish(1, "amq.direct", s.name(), b"unbound")
    drain(c, s.name())
    c.call(1, m.QueueDelete(queue=s.name()))


@scenario("queue.bind with arguments: a binding per argument table")
def _bind_arguments(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name()))
    key = s.name()
    c.call(1, m.QueueBind(queue=s.name(), exchange="amq.direct", routing_key=key))
    c.call(
        1, m.QueueBind(queue=s.name(), exchange="amq.direct", routing_key=key, arguments={"a": 1})
    )
    c.call(1, m.QueueUnbind(queue=s.name(), exchange="amq.direct", routing_key=key))
    c.publish(1, "amq.direct", key, b"still bound with arguments")
    c.call(
        1,
        m.QueueUnbind(queue=s.name(), exchange="amq.direct", routing_key=key, arguments={"a": 1}),
    )
    c.publish(1, "amq.direct", key, b"unbound")
    drain(c, s.name())
    c.call(1, m.QueueDelete(queue=s.name()))


@scenario("queue.unbind of a missing binding, queue or exchange")
def _unbind_missing(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.call(1, m.ExchangeDeclare(exchange=s.name("x")))
    for queue, exchange in (("q", "x"), ("q", "nox"), ("noq", "x"), ("noq", "nox")):
        call_reopen(c, m.QueueUnbind(queue=s.name(queue), exchange=s.name(exchange)))
    c.call(1, m.QueueDelete(queue=s.name()))
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))


@scenario("queue.bind nowait of a missing exchange closes the channel")
def _bind_nowait(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.send(1, m.QueueBind(queue=s.name(), exchange="amq.topic", routing_key="#", nowait=True))
    c.publish(1, "amq.topic", "any.key", b"bound")
    drain(c, s.name())
    c.send(1, m.QueueBind(queue=s.name(), exchange=s.name("nox"), nowait=True))
    c.sync(1)
    c.open(1)
    c.call(1, m.QueueDelete(queue=s.name()))


# queue.purge.
@scenario("queue.purge counts ready messages and leaves unacked ones")
def _purge(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name()))
    for body in (b"1", b"2", b"3"):
        c.publish(1, "", s.name(), body)
    c.call(1, m.BasicGet(queue=s.name()))
    c.call(1, m.QueuePurge(queue=s.name()))
    c.call(1, m.QueuePurge(queue=s.name()))
    # The unacked message survived the purges: acking it is no error.
    c.send(1, m.BasicAck(delivery_tag=1))
    c.publish(1, "", s.name(), b"4")
    c.send(1, m.QueuePurge(queue=s.name(), nowait=True))
    # basic.get, not a declare: RabbitMQ's queue answers a declare ahead of the casts
    # (publish, ack) it has not handled yet.
    c.call(1, m.BasicGet(queue=s.name()))
    c.call(1, m.QueueDelete(queue=s.name()))


@scenario("queue.purge of a missing queue")
def _purge_missing(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueuePurge(queue=s.name()))


# queue.delete.
@scenario("queue.delete of a missing queue")
def _delete_missing(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDelete(queue=s.name()))
    c.call(1, m.QueueDelete(queue=s.name(), if_unused=True, if_empty=True))
    c.send(1, m.QueueDelete(queue=s.name(), nowait=True))
    c.sync(1)


@scenario("queue.delete counts the messages it drops")
def _delete_counts(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name()))
    for body in (b"1", b"2", b"3"):
        c.publish(1, "", s.name(), body)
    c.call(1, m.BasicGet(queue=s.name()))
    c.call(1, m.QueueDelete(queue=s.name()))
    c.send(1, m.BasicAck(delivery_tag=1))
    c.sync(1)


@scenario("queue.delete if_empty of a queue with messages")
def _delete_if_empty(s: Session) -> None:
    c = s.channel()
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.publish(1, "", s.name(), b"1")
    c.call(1, m.QueueDelete(queue=s.name(), if_empty=True))
    c.open(1)
    c.call(1, m.BasicGet(queue=s.name()))
    c.call(1, m.QueueDelete(queue=s.name(), if_empty=True))
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))


@scenario("queue.delete if_unused of a queue with a consumer")
def _delete_if_unused(s: Session) -> None:
    c = s.channel()
    s.channel(2, c)
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.call(2, m.BasicConsume(queue=s.name(), consumer_tag="ctag"))
    c.call(1, m.QueueDelete(queue=s.name(), if_unused=True))
    c.open(1)
    c.call(2, m.BasicCancel(consumer_tag="ctag"))
    c.call(1, m.QueueDelete(queue=s.name(), if_unused=True))


@scenario("queue.delete from another connection cancels the consumer")
def _delete_cancels(s: Session) -> None:
    c = s.channel()
    other = s.channel(1, s.connect())
    c.call(1, m.QueueDeclare(queue=s.name()))
    c.call(1, m.BasicConsume(queue=s.name(), consumer_tag="ctag"))
    other.call(1, m.QueueDelete(queue=s.name()))
    c.expect(1, "basic.cancel")
    c.call(1, m.BasicCancel(consumer_tag="ctag"))
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))
