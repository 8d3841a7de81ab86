"""basic.publish and basic.get, with their error paths: returns, refused publishes,
properties and bodies as they travel, TTL and priorities, and the redelivered flag a
message carries back after each way of giving it back (nack, reject, recover, close)."""

from __future__ import annotations

from decimal import Decimal

from amqp_gateway.codec import BasicProperties
from amqp_gateway.codec import methods as m
from amqp_gateway.codec import values as v
from tests.differential.harness import Conn, Session, scenario

MANY_FRAMES_BYTES = 300_000  # over twice the 131072-byte frame_max both brokers offer


def declare(c: Conn, queue: str, channel: int = 1, **arguments: object) -> None:
    c.call(channel, m.QueueDeclare(queue=queue, arguments=arguments))  # type: ignore[arg-type]


def depth(c: Conn, queue: str, channel: int = 1) -> None:
    """Log the queue's ready-message and consumer counts (a passive declare)."""
    c.call(channel, m.QueueDeclare(queue=queue, passive=True))


def get(c: Conn, queue: str, channel: int = 1, *, no_ack: bool = False) -> None:
    c.call(channel, m.BasicGet(queue=queue, no_ack=no_ack))


def tagged(value: object) -> object:
    """`value` with the Python type of every table value, so a tag a broker changed shows
    (an Int8 equals the int it holds, so plain comparison would not see it)."""
    if isinstance(value, dict):
        return {k: tagged(item) for k, item in value.items()}
    if isinstance(value, list):
        return [tagged(item) for item in value]
    return (type(value).__name__, value)


def record_last_content(s: Session) -> None:
    """Record the header types and the timestamp of the last content read (the harness
    blanks a `timestamp` key, and compares table values without their tags)."""
    content = next(o for o in reversed(s.log) if o[1] == "content")
    properties = content[4]
    s.record("headers", tagged(properties.get("headers")), "stamp", properties.get("timestamp"))


EVERY_TYPE: dict[str, object] = {
    "bool": True,
    "int8": v.Int8(-5),
    "uint8": v.UInt8(250),
    "int16": v.Int16(-30000),
    "uint16": v.UInt16(60000),
    "int32": -(1 << 30),
    "uint32": v.UInt32(4_000_000_000),
    "int64": v.Int64(-(1 << 40)),
    "float32": v.Float32(1.5),
    "float64": 2.25,
    "decimal": Decimal("3.14"),
    "longstr": "text é",
    "array": [1, "two", [v.Int8(3)], {"k": None}],
    "timestamp": v.Timestamp(1_700_000_000),
    "table": {"nested": {"deep": v.UInt16(7)}, "list": []},
    "void": None,
    "bytes": b"\x00\xff raw",
}

ALL_PROPERTIES = BasicProperties(
    content_type="application/json",
    content_encoding="gzip",
    headers=EVERY_TYPE,  # type: ignore[arg-type]
    delivery_mode=2,
    priority=7,
    correlation_id="corr-1",
    reply_to="reply-queue",
    expiration="60000",
    message_id="msg-1",
    timestamp=1_600_000_000,
    type="kind",
    user_id="guest",
    app_id="app",
    cluster_id="cluster",
)


# basic.publish


@scenario("basic.publish mandatory unroutable returns 312 NO_ROUTE with the content")
def _mandatory_unroutable(s: Session) -> None:
    c = s.channel()
    properties = BasicProperties(content_type="text/plain", headers={"h": 1}, message_id="m1")
    c.publish(1, "amq.direct", s.name("nowhere"), b"returned", properties, mandatory=True)
    c.sync(1)
    c.publish(1, "", s.name("missing"), b"to the default", mandatory=True)
    c.sync(1)


@scenario("basic.publish mandatory routable and unroutable without mandatory: no return")
def _mandatory_routed(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.publish(1, "", s.name(), b"routed", mandatory=True)
    c.publish(1, "amq.direct", s.name("nowhere"), b"dropped")
    c.sync(1)
    depth(c, s.name())


@scenario("basic.publish mandatory unroutable on a confirm channel: return then ack")
def _mandatory_confirm(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ConfirmSelect())
    c.publish(1, "amq.fanout", "", b"nobody bound", mandatory=True)
    c.confirms(1, 1)


@scenario("basic.publish immediate=true closes the connection 540")
def _immediate(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.client.send_content(1, m.BasicPublish(routing_key=s.name(), immediate=True), b"now")
    c.sync(1)


@scenario("basic.publish to an internal exchange is refused 403")
def _internal_exchange(s: Session) -> None:
    c = s.channel()
    c.call(1, m.ExchangeDeclare(exchange=s.name("x"), type="fanout", internal=True))
    c.publish(1, s.name("x"), "", b"inside")
    c.sync(1)
    c.open(1)
    c.call(1, m.ExchangeDelete(exchange=s.name("x")))


@scenario("basic.publish to amq.default by name is refused 404")
def _amq_default(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.publish(1, "amq.default", s.name(), b"named")
    c.sync(1)
    c.open(1)
    depth(c, s.name())


def _round_trip(via_consume: bool):  # type: ignore[no-untyped-def]
    def run(s: Session) -> None:
        c = s.channel()
        declare(c, s.name())
        if via_consume:
            c.call(1, m.BasicConsume(queue=s.name(), consumer_tag="t", no_ack=True))
        c.publish(1, "", s.name(), b"{}", ALL_PROPERTIES)
        if via_consume:
            c.expect(1, "basic.deliver")
        else:
            c.sync(1)
            get(c, s.name(), no_ack=True)
        record_last_content(s)

    return run


for _via in ("get", "deliver"):
    scenario(f"basic.publish every property and header type round trip via {_via}")(
        _round_trip(_via == "deliver")
    )


@scenario("basic.publish an empty body and an empty property list")
def _empty_body(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.publish(1, "", s.name(), b"", BasicProperties())
    c.publish(1, "", s.name(), b"", BasicProperties(headers={}))
    c.sync(1)
    get(c, s.name(), no_ack=True)
    get(c, s.name(), no_ack=True)


@scenario("basic.publish a body of many frames, read back with a small frame_max")
def _many_frames(s: Session) -> None:
    body = bytes(range(256)) * (MANY_FRAMES_BYTES // 256)
    c = s.channel()
    declare(c, s.name())
    c.publish(1, "", s.name(), body, frame_max=4096)
    c.sync(1)
    small = s.connect(frame_max=4096)
    small.open(1)
    get(small, s.name(), no_ack=True)
    get(c, s.name(), no_ack=True)


@scenario("basic.publish expiration 0 without a consumer is dropped")
def _ttl_zero(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.publish(1, "", s.name(), b"gone", BasicProperties(expiration="0"))
    c.sync(1)
    depth(c, s.name())
    get(c, s.name(), no_ack=True)


@scenario("basic.publish expiration 0 is delivered to a waiting consumer")
def _ttl_zero_consumer(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.call(1, m.BasicConsume(queue=s.name(), consumer_tag="t", no_ack=True))
    c.publish(1, "", s.name(), b"caught", BasicProperties(expiration="0"))
    c.expect(1, "basic.deliver")


@scenario("basic.publish expiration in the future stays; an expired one is not got")
def _ttl_mixed(s: Session) -> None:
    c = s.channel()
    declare(c, s.name(), **{"x-message-ttl": 60000})
    c.publish(1, "", s.name(), b"lives", BasicProperties(expiration="60000"))
    c.publish(1, "", s.name(), b"dies", BasicProperties(expiration="0"))
    c.publish(1, "", s.name(), b"lives too")
    c.sync(1)
    get(c, s.name(), no_ack=True)
    get(c, s.name(), no_ack=True)
    get(c, s.name(), no_ack=True)


for _expiration in ("abc", "-1", "1.5", "+5x", "", "x\x01"):

    def _bad_expiration(s: Session, expiration: str = _expiration) -> None:
        c = s.channel()
        declare(c, s.name())
        c.publish(1, "", s.name(), b"x", BasicProperties(expiration=expiration))
        c.sync(1)

    scenario(f"basic.publish invalid expiration {_expiration!r} is refused 406")(_bad_expiration)


@scenario("basic.publish priorities on an x-max-priority queue: get order")
def _priorities(s: Session) -> None:
    c = s.channel()
    declare(c, s.name(), **{"x-max-priority": 5})
    for body, priority in (
        (b"p1", 1),
        (b"none", None),
        (b"p5", 5),
        (b"p3", 3),
        (b"p9", 9),
        (b"p0", 0),
        (b"p3b", 3),
    ):
        c.publish(1, "", s.name(), body, BasicProperties(priority=priority))
    c.sync(1)
    depth(c, s.name())
    for _ in range(8):
        get(c, s.name(), no_ack=True)


@scenario("basic.publish priorities without x-max-priority keep publish order")
def _no_priorities(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    for body, priority in ((b"p1", 1), (b"p9", 9), (b"p5", 5)):
        c.publish(1, "", s.name(), body, BasicProperties(priority=priority))
    c.sync(1)
    for _ in range(3):
        get(c, s.name(), no_ack=True)


@scenario("basic.publish user_id of another user is refused 406")
def _user_id_mismatch(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    # Confirmed before the depth is read: RabbitMQ under load answered a later declare
    # before it had enqueued an unconfirmed publish (message_count 0 in a full run).
    c.call(1, m.ConfirmSelect())
    c.publish(1, "", s.name(), b"x", BasicProperties(user_id="guest"))
    c.confirms(1, 1)
    c.publish(1, "", s.name(), b"x", BasicProperties(user_id="bob"))
    c.sync(1)
    c.open(1)
    depth(c, s.name())


@scenario("basic.publish expiration with a sign, zeros in front or beyond 32 bits is taken")
def _expiration_edges(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    for expiration in ("+60000", "+0", "-0", "4294967296", "99999999999999999999", "060000"):
        c.publish(1, "", s.name(), expiration.encode(), BasicProperties(expiration=expiration))
    c.sync(1)
    depth(c, s.name())
    for _ in range(5):
        get(c, s.name(), no_ack=True)


@scenario("basic.publish user_id of another user by an impersonator is taken")
def _impersonator(s: Session) -> None:
    user = s.name("imp")
    s.record(s.http("PUT", f"/api/users/{user}", {"password": user, "tags": "impersonator"})[0])
    s.cleanups.append(lambda: s.http("DELETE", f"/api/users/{user}"))
    permissions = {"configure": ".*", "write": ".*", "read": ".*"}
    s.record(s.http("PUT", f"/api/permissions/%2F/{user}", permissions)[0])
    c = s.connect(user=user, password=user)
    c.open(1)
    declare(c, s.name())
    c.publish(1, "", s.name(), b"x", BasicProperties(user_id="someone-else"))
    c.sync(1)
    get(c, s.name(), no_ack=True)


@scenario("basic.publish user_id mismatch in a burst: the ones before it are stored")
def _user_id_burst(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    for user_id in ("guest", None, "guest", "bob", "guest"):
        c.publish(1, "", s.name(), b"x", BasicProperties(user_id=user_id))
    c.sync(1)
    c.open(1)
    depth(c, s.name())


@scenario("basic.publish CC and BCC headers route to more queues; BCC is removed")
def _cc_bcc(s: Session) -> None:
    c = s.channel()
    for queue in ("main", "cc1", "cc2", "bcc"):
        declare(c, s.name(queue))
        c.call(1, m.QueueBind(queue=s.name(queue), exchange="amq.direct", routing_key=queue))
    headers: dict[str, object] = {"CC": ["cc1", "cc2"], "BCC": ["bcc"], "keep": "me"}
    c.publish(1, "amq.direct", "main", b"copied", BasicProperties(headers=headers))  # type: ignore[arg-type]
    c.sync(1)
    for queue in ("main", "cc1", "cc2", "bcc"):
        get(c, s.name(queue), no_ack=True)


@scenario("basic.publish a CC header that is not an array is refused 406")
def _cc_not_array(s: Session) -> None:
    c = s.channel()
    for queue in ("main", "cc"):
        declare(c, s.name(queue))
        c.call(1, m.QueueBind(queue=s.name(queue), exchange="amq.direct", routing_key=queue))
    c.publish(1, "amq.direct", "main", b"x", BasicProperties(headers={"CC": "cc"}))
    c.sync(1)
    c.open(1)
    get(c, s.name("main"), no_ack=True)
    get(c, s.name("cc"), no_ack=True)


# basic.get


@scenario("basic.get on an empty queue: get-empty")
def _get_empty(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    get(c, s.name())
    get(c, s.name(), no_ack=True)


@scenario("basic.get-ok fields: message_count, exchange, routing_key, delivery tags")
def _get_fields(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    c.call(1, m.QueueBind(queue=s.name(), exchange="amq.topic", routing_key="a.*"))
    c.publish(1, "amq.topic", "a.b", b"1")
    c.publish(1, "", s.name(), b"2")
    c.publish(1, "amq.topic", "a.c", b"3")
    c.sync(1)
    for _ in range(4):
        get(c, s.name())
    c.send(1, m.BasicAck(delivery_tag=3, multiple=True))
    c.sync(1)


@scenario("basic.get with ack holds the message unacked; no_ack removes it")
def _get_ack_modes(s: Session) -> None:
    c = s.channel()
    declare(c, s.name())
    for body in (b"a", b"b"):
        c.publish(1, "", s.name(), body)
    c.sync(1)
    get(c, s.name(), no_ack=False)
    depth(c, s.name())
    get(c, s.name(), no_ack=True)
    depth(c, s.name())
    c.send(1, m.BasicAck(delivery_tag=1))
    c.sync(1)
    depth(c, s.name())


@scenario("basic.get on a missing queue closes the channel 404")
def _get_missing(s: Session) -> None:
    c = s.channel()
    get(c, s.name("missing"))
    c.open(1)
    get(c, s.name("missing"), no_ack=True)


@scenario("basic.get on an exclusive queue of another connection is refused 405")
def _get_exclusive(s: Session) -> None:
    owner = s.channel()
    owner.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))
    other = s.connect()
    other.open(1)
    get(other, s.name())


def _redelivery(how: str):  # type: ignore[no-untyped-def]
    def run(s: Session) -> None:
        c = s.channel()
        declare(c, s.name())
        for body in (b"first", b"second"):
            c.publish(1, "", s.name(), body)
        c.sync(1)
        get(c, s.name())
        if how == "nack":
            c.send(1, m.BasicNack(delivery_tag=1, requeue=True))
        elif how == "reject":
            c.send(1, m.BasicReject(delivery_tag=1, requeue=True))
        elif how == "recover":
            c.call(1, m.BasicRecover(requeue=True))
        else:
            c.call(1, m.ChannelClose(reply_code=200, reply_text="bye"))
            c.open(1)
        c.sync(1)
        depth(c, s.name())
        get(c, s.name())
        get(c, s.name())
        get(c, s.name())

    return run


for _how in ("nack", "reject", "recover", "channel close"):
    scenario(f"basic.get redelivered after {_how} with requeue")(_redelivery(_how))
