"""The exchange class (declare, delete, bind, unbind) and routing through each exchange
type: what each method answers, its errors, and where a publish lands (read back with
basic.get, which sees every publish made before it on the same channel)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from tests.differential.harness import Conn, Session, scenario

GETS_MAX = 50  # more than any scenario here queues


def drain(c: Conn, queue: str, channel: int = 1) -> None:
    """basic.get (no-ack) until the queue answers get-empty: each message is logged."""
    for _ in range(GETS_MAX):
        if c.call(channel, m.BasicGet(queue=queue, no_ack=True))[2] != "basic.get-ok":
            return


def call_reopen(c: Conn, method: codec.Method, channel: int = 1) -> None:
    """Call `method`; if the broker closes the channel over it, open the channel again."""
    if c.call(channel, method)[2] == "channel.close":
        c.open(channel)


def bound_queue(s: Session, c: Conn, exchange: str, key: str = "", base: str = "q") -> str:
    """A queue bound to `exchange` with `key`; its name."""
    queue = s.name(base)
    c.call(1, m.QueueDeclare(queue=queue))
    c.call(1, m.QueueBind(queue=queue, exchange=exchange, routing_key=key))
    return queue


# exchange.declare of each type.
def _declare_type(kind: str) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel()
        c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type=kind))
        c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type=kind))
        # A passive declare does not compare the type.
        c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout", passive=True))
        c.call(1, m.ExchangeDelete(exchange=s.name("x")))
        c.call(1, m.ExchangeDeclare(exchange=s.name("x"), passive=True))

    return run


for _kind in ("direct", "fanout", "topic", "headers"):
    scenario(f"exchange.declare of type {_kind}, redeclare, passive, delete")(_declare_type(_kind))


@scenario("exchange.declare of an unknown type closes the connection")
def _declare_unknown_type(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="bogus"))


@scenario("exchange.declare passive of an unknown type on an existing exchange")
def _passive_unknown_type(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="topic"))
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="bogus", passive=True))
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))


# Redeclaring with a different property: 406 and the exchange unchanged.
_REDECLARES: dict[str, tuple[m.ExchangeDeclare, m.ExchangeDeclare]] = {
    "type": (m.ExchangeDeclare(type="direct"), m.ExchangeDeclare(type="topic")),
    "durable": (m.ExchangeDeclare(durable=False), m.ExchangeDeclare(durable=True)),
    "auto_delete": (m.ExchangeDeclare(auto_delete=False), m.ExchangeDeclare(auto_delete=True)),
    "internal": (m.ExchangeDeclare(internal=False), m.ExchangeDeclare(internal=True)),
    "added argument": (
        m.ExchangeDeclare(),
        m.ExchangeDeclare(arguments={"alternate-exchange": "amq.fanout"}),
    ),
    "changed argument": (
        m.ExchangeDeclare(arguments={"alternate-exchange": "amq.fanout"}),
        m.ExchangeDeclare(arguments={"alternate-exchange": "amq.topic"}),
    ),
    "unknown argument": (
        m.ExchangeDeclare(arguments={"x-foo": 1}),
        m.ExchangeDeclare(arguments={"x-foo": 2}),
    ),
}


def _redeclare(first: m.ExchangeDeclare, second: m.ExchangeDeclare) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel()
        name = s.name("x")
        c.call(1, replace(first, exchange=name))
        call_reopen(c, replace(second, exchange=name))
        c.call(1, replace(first, exchange=name))
        c.call(1, m.ExchangeDelete(exchange=name))

    return run


for _what, (_first, _second) in _REDECLARES.items():
    scenario(f"exchange.declare again with a different {_what}")(_redeclare(_first, _second))


@scenario("exchange.declare passive of a missing exchange")
def _passive_missing(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), passive=True))
    c.open(1)
    c.send(1, m.ExchangeDeclare(exchange=s.name("x"), passive=True, nowait=True))
    c.sync(1)


@scenario("exchange.declare passive of the default exchange")
def _passive_default(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange="", passive=True))


@scenario("exchange.declare of the default exchange")
def _declare_default(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange="", type="direct"))


@scenario("exchange.declare of amq. names")
def _declare_amq(s: Session) -> None:
    c = s.channel()
    for declare in (
        m.ExchangeDeclare(exchange="amq.topic", type="topic", passive=True),
        m.ExchangeDeclare(exchange="amq.topic", type="topic", durable=True),
        m.ExchangeDeclare(exchange="amq.topic", type="topic", durable=False),
        m.ExchangeDeclare(exchange="amq." + s.name("x"), type="direct"),
        m.ExchangeDeclare(exchange="amq." + s.name("x"), passive=True),
    ):
        call_reopen(c, declare)


@scenario("exchange.declare of every predeclared exchange, passive")
def _predeclared(s: Session) -> None:
    c = s.channel()
    for name in ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        c.call(1, m.ExchangeDeclare(exchange=name, passive=True))


@scenario("exchange.declare nowait: nothing answers, an error still closes")
def _declare_nowait(s: Session) -> None:
    c = s.channel()
    c.send(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout", nowait=True))
    c.sync(1)
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), passive=True))
    c.send(1, m.ExchangeDeclare(exchange=s.name("x"), type="topic", nowait=True))
    c.sync(1)
    c.open(1)
    c.send(1, m.ExchangeDelete(exchange=s.name("x"), nowait=True))
    c.sync(1)
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), passive=True))


# Internal exchanges.
@scenario("publish to an internal exchange is refused")
def _publish_internal(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout", internal=True))
    c.publish(1, s.name("x"), "k")
    c.sync(1)
    c.open(1)
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))


@scenario("an internal exchange routes what reaches it through an exchange binding")
def _internal_routes(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("front"), type="direct"))
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout", internal=True))
    c.call(1, m.ExchangeBind(destination=s.name("x"), source=s.name("front"), routing_key="k"))
    queue = bound_queue(s, c, s.name("x"))
    c.publish(1, s.name("front"), "k", b"through")
    c.publish(1, s.name("front"), "other", b"dropped")
    drain(c, queue)
    for name in ("front", "x"):
        c.call(1, m.ExchangeDelete(exchange=s.name(name)))
    c.call(1, m.QueueDelete(queue=queue))


# Alternate exchanges.
@scenario("alternate-exchange takes what the exchange cannot route")
def _alternate(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("ae"), type="fanout"))
    c.call(
        1,
        m.ExchangeDeclare(
            exchange=s.name("x"), type="direct", arguments={"alternate-exchange": s.name("ae")}
        ),
    )
    routed = bound_queue(s, c, s.name("x"), "k", "routed")
    spare = bound_queue(s, c, s.name("ae"), "", "spare")
    c.publish(1, s.name("x"), "k", b"routed")
    c.publish(1, s.name("x"), "other", b"alternate", mandatory=True)
    c.sync(1)
    drain(c, routed)
    drain(c, spare)
    for name in ("x", "ae"):
        c.call(1, m.ExchangeDelete(exchange=s.name(name)))
    for queue in (routed, spare):
        c.call(1, m.QueueDelete(queue=queue))


@scenario("alternate-exchange that does not exist: mandatory publish is returned")
def _alternate_missing(s: Session) -> None:
    c = s.channel()
    c.call(
        1,
        m.ExchangeDeclare(
            exchange=s.name("x"), type="direct", arguments={"alternate-exchange": s.name("ae")}
        ),
    )
    c.publish(1, s.name("x"), "other", b"lost", mandatory=True)
    c.expect(1, "basic.return")
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))


@scenario("alternate-exchange that routes nowhere either: mandatory publish is returned")
def _alternate_unroutable(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("ae"), type="direct"))
    c.call(
        1,
        m.ExchangeDeclare(
            exchange=s.name("x"), type="direct", arguments={"alternate-exchange": s.name("ae")}
        ),
    )
    c.publish(1, s.name("x"), "k", b"lost", mandatory=True)
    c.expect(1, "basic.return")
    for name in ("x", "ae"):
        c.call(1, m.ExchangeDelete(exchange=s.name(name)))


# exchange.delete.
@scenario("exchange.delete of a missing exchange")
def _delete_missing(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))
    c.call(1, m.ExchangeDelete(exchange=s.name("x"), if_unused=True))
    c.send(1, m.ExchangeDelete(exchange=s.name("x"), nowait=True))
    c.sync(1)


@scenario("exchange.delete if_unused of an exchange with a queue binding")
def _delete_if_unused(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="direct"))
    queue = bound_queue(s, c, s.name("x"), "k")
    c.call(1, m.ExchangeDelete(exchange=s.name("x"), if_unused=True))
    c.open(1)
    c.call(1, m.QueueUnbind(queue=queue, exchange=s.name("x"), routing_key="k"))
    c.call(1, m.ExchangeDelete(exchange=s.name("x"), if_unused=True))
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), passive=True))
    c.open(1)
    c.call(1, m.QueueDelete(queue=queue))


@scenario("exchange.delete if_unused of an exchange that is only a binding's destination")
def _delete_if_unused_destination(s: Session) -> None:
    c = s.channel()
    for name in ("src", "dst"):
        c.call(1, m.ExchangeDeclare(exchange=s.name(name), type="fanout"))
    c.call(1, m.ExchangeBind(destination=s.name("dst"), source=s.name("src")))
    for name in ("src", "dst", "src"):
        call_reopen(c, m.ExchangeDelete(exchange=s.name(name), if_unused=True))


@scenario("exchange.delete removes its bindings")
def _delete_bindings(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout"))
    queue = bound_queue(s, c, s.name("x"))
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout"))
    c.publish(1, s.name("x"), "", b"nowhere")
    c.call(1, m.QueueDeclare(queue=queue, passive=True))
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))
    c.call(1, m.QueueDelete(queue=queue))


@scenario("exchange.delete of the default exchange")
def _delete_default(s: Session) -> None:
    c = s.channel()
    call_reopen(c, m.ExchangeDelete(exchange=""))
    call_reopen(c, m.ExchangeDelete(exchange="", if_unused=True))


@scenario("exchange.delete of amq. exchanges")
def _delete_amq(s: Session) -> None:
    c = s.channel()
    call_reopen(c, m.ExchangeDelete(exchange="amq.direct"))
    call_reopen(c, m.ExchangeDelete(exchange="amq." + s.name("x")))
    c.call(1, m.ExchangeDeclare(exchange="amq.direct", passive=True))


# exchange.bind and exchange.unbind.
@scenario("exchange.bind routes through to the destination's queues, unbind stops it")
def _e2e(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("src"), type="topic"))
    c.call(1, m.ExchangeDeclare(exchange=s.name("dst"), type="direct"))
    c.call(1, m.ExchangeBind(destination=s.name("dst"), source=s.name("src"), routing_key="a.*"))
    queue = bound_queue(s, c, s.name("dst"), "a.b")
    for key in ("a.b", "a.c", "b.b"):
        c.publish(1, s.name("src"), key, key.encode())
    drain(c, queue)
    c.call(1, m.ExchangeUnbind(destination=s.name("dst"), source=s.name("src"), routing_key="a.*"))
    c.publish(1, s.name("src"), "a.b", b"after unbind")
    drain(c, queue)
    for name in ("src", "dst"):
        c.call(1, m.ExchangeDelete(exchange=s.name(name)))
    c.call(1, m.QueueDelete(queue=queue))


@scenario("exchange bindings in a cycle deliver one copy per queue")
def _e2e_cycle(s: Session) -> None:
    c = s.channel()
    for name in ("a", "b"):
        c.call(1, m.ExchangeDeclare(exchange=s.name(name), type="fanout"))
    c.call(1, m.ExchangeBind(destination=s.name("b"), source=s.name("a")))
    c.call(1, m.ExchangeBind(destination=s.name("a"), source=s.name("b")))
    qa = bound_queue(s, c, s.name("a"), "", "qa")
    c.call(1, m.QueueBind(queue=qa, exchange=s.name("b")))
    qb = bound_queue(s, c, s.name("b"), "", "qb")
    c.publish(1, s.name("a"), "k", b"once")
    drain(c, qa)
    drain(c, qb)
    for name in ("a", "b"):
        c.call(1, m.ExchangeDelete(exchange=s.name(name)))
    for queue in (qa, qb):
        c.call(1, m.QueueDelete(queue=queue))


@scenario("exchange.bind to itself")
def _e2e_self(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout"))
    c.call(1, m.ExchangeBind(destination=s.name("x"), source=s.name("x")))
    queue = bound_queue(s, c, s.name("x"))
    c.publish(1, s.name("x"), "", b"once")
    drain(c, queue)
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))
    c.call(1, m.QueueDelete(queue=queue))


@scenario("exchange.bind twice is one binding")
def _e2e_twice(s: Session) -> None:
    c = s.channel()
    for name in ("src", "dst"):
        c.call(1, m.ExchangeDeclare(exchange=s.name(name), type="fanout"))
    for _ in range(2):
        c.call(1, m.ExchangeBind(destination=s.name("dst"), source=s.name("src"), routing_key="k"))
    queue = bound_queue(s, c, s.name("dst"))
    c.publish(1, s.name("src"), "k", b"once")
    drain(c, queue)
    c.call(1, m.ExchangeUnbind(destination=s.name("dst"), source=s.name("src"), routing_key="k"))
    c.publish(1, s.name("src"), "k", b"unbound")
    drain(c, queue)
    for name in ("src", "dst"):
        c.call(1, m.ExchangeDelete(exchange=s.name(name)))
    c.call(1, m.QueueDelete(queue=queue))


@scenario("exchange.unbind of a binding that does not exist")
def _unbind_missing(s: Session) -> None:
    c = s.channel()
    for name in ("src", "dst"):
        c.call(1, m.ExchangeDeclare(exchange=s.name(name), type="direct"))
    for source, destination in (("src", "dst"), ("nosrc", "dst"), ("src", "nodst")):
        call_reopen(c, m.ExchangeUnbind(destination=s.name(destination), source=s.name(source)))
    for name in ("src", "dst"):
        c.call(1, m.ExchangeDelete(exchange=s.name(name)))


def _bind_missing(source: str, destination: str) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel()
        c.call(1, m.ExchangeDeclare(exchange=s.name("present"), type="direct"))
        call_reopen(c, m.ExchangeBind(destination=s.name(destination), source=s.name(source)))
        c.call(1, m.ExchangeDelete(exchange=s.name("present")))

    return run


for _source, _destination in (("gone", "present"), ("present", "gone"), ("gone", "gone2")):
    scenario(f"exchange.bind from {_source} to {_destination}")(
        _bind_missing(_source, _destination)
    )


@scenario("exchange.bind with the default exchange as source or destination")
def _bind_default(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="direct"))
    call_reopen(c, m.ExchangeBind(destination=s.name("x"), source="", routing_key="k"))
    call_reopen(c, m.ExchangeBind(destination="", source=s.name("x"), routing_key="k"))
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))


@scenario("exchange.bind and unbind nowait")
def _bind_nowait(s: Session) -> None:
    c = s.channel()
    for name in ("src", "dst"):
        c.call(1, m.ExchangeDeclare(exchange=s.name(name), type="fanout"))
    c.send(1, m.ExchangeBind(destination=s.name("dst"), source=s.name("src"), nowait=True))
    queue = bound_queue(s, c, s.name("dst"))
    c.publish(1, s.name("src"), "", b"bound")
    drain(c, queue)
    c.send(1, m.ExchangeUnbind(destination=s.name("dst"), source=s.name("src"), nowait=True))
    c.publish(1, s.name("src"), "", b"unbound")
    drain(c, queue)
    c.send(1, m.ExchangeBind(destination=s.name("dst"), source=s.name("nosrc"), nowait=True))
    c.sync(1)
    c.open(1)
    for name in ("src", "dst"):
        c.call(1, m.ExchangeDelete(exchange=s.name(name)))
    c.call(1, m.QueueDelete(queue=queue))


# Routing by exchange type.
_TOPIC_KEYS = ("", "a", "b", "a.b", "a.b.c", "b.a", "a..b", "a.", ".a", ".", "..", "x.a.b")


def _topic(binding_key: str) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel()
        c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="topic"))
        queue = bound_queue(s, c, s.name("x"), binding_key)
        for key in _TOPIC_KEYS:
            c.publish(1, s.name("x"), key, key.encode())
        drain(c, queue)
        c.call(1, m.ExchangeDelete(exchange=s.name("x")))
        c.call(1, m.QueueDelete(queue=queue))

    return run


for _key in ("*", "#", "", "a.*", "#.b", "a..b", "a.", ".a", "*.*", "a.#", "#.#", "*.#.b"):
    scenario(f"topic routing of binding key {_key!r}")(_topic(_key))


@scenario("fanout routing ignores routing keys and binding keys")
def _fanout(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout"))
    q1 = bound_queue(s, c, s.name("x"), "k", "q1")
    q2 = bound_queue(s, c, s.name("x"), "", "q2")
    for key in ("", "k", "other"):
        c.publish(1, s.name("x"), key, key.encode())
    drain(c, q1)
    drain(c, q2)
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))
    for queue in (q1, q2):
        c.call(1, m.QueueDelete(queue=queue))


@scenario("direct routing matches the whole key exactly")
def _direct(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="direct"))
    queue = bound_queue(s, c, s.name("x"), "a.b")
    c.call(1, m.QueueBind(queue=queue, exchange=s.name("x"), routing_key=""))
    for key in ("a.b", "a", "A.B", "a.b.", "", "*", "#", "a.*"):
        c.publish(1, s.name("x"), key, key.encode())
    drain(c, queue)
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))
    c.call(1, m.QueueDelete(queue=queue))


@scenario("a queue bound twice to one exchange gets one copy")
def _two_bindings(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="topic"))
    queue = bound_queue(s, c, s.name("x"), "a.*")
    c.call(1, m.QueueBind(queue=queue, exchange=s.name("x"), routing_key="*.b"))
    c.publish(1, s.name("x"), "a.b", b"both")
    drain(c, queue)
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))
    c.call(1, m.QueueDelete(queue=queue))


_HEADERS: tuple[dict[str, object] | None, ...] = (
    {"a": 1, "b": "two"},
    {"a": 1},
    {"b": "two", "c": 3},
    {"a": "1"},
    {"a": 2, "b": "two"},
    {},
    None,
    {"x-tag": "t"},
    {"a": 1, "x-tag": "t"},
    {"x-tag": "t", "b": "two"},
)


def _headers(arguments: dict[str, object]) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel()
        c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="headers"))
        queue = s.name()
        c.call(1, m.QueueDeclare(queue=queue))
        c.call(1, m.QueueBind(queue=queue, exchange=s.name("x"), arguments=arguments))  # type: ignore[arg-type]  # plain field values
        for number, headers in enumerate(_HEADERS):
            properties = codec.BasicProperties(headers=headers)  # type: ignore[arg-type]  # plain field values
            c.publish(1, s.name("x"), "k", str(number).encode(), properties)
        drain(c, queue)
        c.call(1, m.ExchangeDelete(exchange=s.name("x")))
        c.call(1, m.QueueDelete(queue=queue))

    return run


_HEADER_BINDINGS: dict[str, dict[str, object]] = {
    "all": {"x-match": "all", "a": 1, "b": "two"},
    "any": {"x-match": "any", "a": 1, "b": "two"},
    "default (all)": {"a": 1, "b": "two"},
    "all of nothing": {"x-match": "all"},
    "any of nothing": {"x-match": "any"},
    "all with an x- header": {"x-match": "all", "x-tag": "t"},
    "all-with-x": {"x-match": "all-with-x", "x-tag": "t"},
    "any-with-x": {"x-match": "any-with-x", "x-tag": "t", "b": "two"},
    "any with an x- header": {"x-match": "any", "x-tag": "t", "b": "two"},
}

for _what, _arguments in _HEADER_BINDINGS.items():
    scenario(f"headers routing, x-match {_what}")(_headers(_arguments))


@scenario("headers binding with an invalid x-match")
def _headers_invalid(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="headers"))
    c.call(1, m.QueueDeclare(queue=s.name()))
    for mode in ("bogus", 1, "ALL"):
        bind = m.QueueBind(queue=s.name(), exchange=s.name("x"), arguments={"x-match": mode})
        call_reopen(c, bind)
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))
    c.call(1, m.QueueDelete(queue=s.name()))
