"""What the common client libraries return or raise: pika's BlockingConnection, aio-pika
(inside `asyncio.run`) and py-amqp (kombu's transport). Each scenario records what the
library's API gave back: exception class names with their reply codes and texts,
message bodies, counts. A difference here is one a user of that library would see."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import amqp
import kombu
import pika
import pika.exceptions

from tests.differential.harness import REPLY_TIMEOUT_S, Session, scenario

FULL: dict[str, Any] = {"x-max-length": 1, "x-overflow": "reject-publish"}


def outcome(s: Session, label: str, call: Callable[[], object]) -> object:
    """Records what `call()` returned, or the class of what it raised with the reply
    code and text it carries (pika, aio-pika and py-amqp name them differently)."""
    try:
        result = call()
    except Exception as exc:
        s.record(label, *described(exc))
        return None
    s.record(label, "returned", result)
    return result


def described(exc: BaseException) -> tuple[object, ...]:
    """An exception as a client reads it: its class and the reply in it, if any."""
    code = getattr(exc, "reply_code", None)
    text = getattr(exc, "reply_text", None)
    if code is None and hasattr(exc, "code"):  # py-amqp's AMQPError
        code, text = exc.code, getattr(exc, "reply_text", None)
    if code is None and len(exc.args) >= 2 and isinstance(exc.args[0], int):
        code, text = exc.args[0], exc.args[1]  # aiormq's ChannelClosed(code, text)
    elif code is None and exc.args and isinstance(exc.args[0], str):
        text = exc.args[0]  # aiormq's ChannelNotFoundEntity(text) and its kin
    return (type(exc).__name__, code, text)


def run_async(s: Session, scenario_body: Callable[[], Awaitable[None]]) -> None:
    """Runs an aio-pika scenario body to its end, with a deadline on the whole."""

    async def bounded() -> None:
        await asyncio.wait_for(scenario_body(), 4 * REPLY_TIMEOUT_S)

    try:
        asyncio.run(bounded())
    except TimeoutError:
        s.record("timed out")


# pika.


@scenario("pika: a nack from a full reject-publish queue raises NackError, unroutable is fine")
def _pika_nack(s: Session) -> None:
    ch = s.pika().channel()
    ch.confirm_delivery()
    ch.queue_declare(s.name(), arguments=FULL)
    publish = ch.basic_publish
    outcome(s, "first", lambda: publish("", s.name(), b"kept"))
    try:
        publish("", s.name(), b"refused")
        s.record("second", "returned")
    except pika.exceptions.NackError as exc:
        s.record("second", "NackError", [m.body for m in exc.messages])
    outcome(s, "unroutable", lambda: publish("amq.direct", s.name("nowhere"), b"u"))
    outcome(s, "to no queue", lambda: publish("", s.name("no-such"), b"u"))
    outcome(s, "count", lambda: ch.queue_declare(s.name(), passive=True).method.message_count)


@scenario("pika: a mandatory unroutable publish raises UnroutableError")
def _pika_unroutable(s: Session) -> None:
    ch = s.pika().channel()
    ch.confirm_delivery()
    try:
        ch.basic_publish("amq.direct", s.name("nowhere"), b"back", mandatory=True)
        s.record("returned")
    except pika.exceptions.UnroutableError as exc:
        s.record("UnroutableError", [(m.method.reply_code, m.body) for m in exc.messages])
    ch.queue_declare(s.name())
    outcome(s, "routed", lambda: ch.basic_publish("", s.name(), b"in", mandatory=True))


@scenario("pika: consume three, cancel requeues the unacked")
def _pika_consume(s: Session) -> None:
    ch = s.pika().channel()
    ch.queue_declare(s.name())
    for body in (b"a", b"b", b"c"):
        ch.basic_publish("", s.name(), body)
    seen = []
    for method, _properties, body in ch.consume(s.name(), inactivity_timeout=REPLY_TIMEOUT_S):
        if method is None:
            break
        seen.append((body, method.redelivered, method.delivery_tag))
        if len(seen) == 1:
            ch.basic_ack(method.delivery_tag)
        if len(seen) == 3:
            break
    s.record("consumed", seen)
    outcome(s, "cancel", ch.cancel)
    outcome(s, "get", lambda: ch.basic_get(s.name(), auto_ack=True)[2])
    outcome(s, "count", lambda: ch.queue_declare(s.name(), passive=True).method.message_count)


@scenario("pika: basic_consume callback and basic_cancel")
def _pika_callback(s: Session) -> None:
    connection = s.pika()
    ch = connection.channel()
    ch.queue_declare(s.name())
    bodies: list[bytes] = []

    def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
        bodies.append(body)
        channel.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(s.name(), on_message, consumer_tag="pika-tag")
    s.record("tag", tag)
    ch.basic_publish("", s.name(), b"one")
    ch.basic_publish("", s.name(), b"two")
    while len(bodies) < 2:
        connection.process_data_events(time_limit=REPLY_TIMEOUT_S)
    s.record("bodies", bodies)
    outcome(s, "cancel", lambda: ch.basic_cancel(tag))
    outcome(s, "consumers", lambda: ch.queue_declare(s.name(), passive=True).method.consumer_count)


@scenario("pika: a passive declare of a missing queue closes the channel with 404")
def _pika_404(s: Session) -> None:
    connection = s.pika()
    ch = connection.channel()
    outcome(s, "declare", lambda: ch.queue_declare(s.name(), passive=True))
    s.record("closed", ch.is_closed, connection.is_open)
    ch2 = connection.channel()
    outcome(s, "exchange", lambda: ch2.exchange_declare("amq.direct", "fanout"))
    ch3 = connection.channel()
    outcome(s, "publish", lambda: ch3.basic_publish(s.name("missing-x"), "k", b"x"))
    outcome(s, "after", lambda: ch3.queue_declare(s.name()))


@scenario("pika: basic_get, reject with requeue, nack without")
def _pika_get(s: Session) -> None:
    ch = s.pika().channel()
    ch.queue_declare(s.name())
    ch.basic_publish("", s.name(), b"one", pika.BasicProperties(headers={"h": 1}))
    ch.basic_publish("", s.name(), b"two")
    method, properties, body = ch.basic_get(s.name())
    s.record("get", body, method.message_count, method.redelivered, properties.headers)
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = ch.basic_get(s.name())
    s.record("again", body, method.message_count, method.redelivered)
    ch.basic_nack(method.delivery_tag, requeue=False)
    method, _, body = ch.basic_get(s.name(), auto_ack=True)
    s.record("next", body, method.message_count, method.redelivered)
    s.record("empty", ch.basic_get(s.name()))


# aio-pika.


@scenario("aio-pika: declare, publish with confirms, get")
def _aio_publish_get(s: Session) -> None:
    async def body() -> None:
        connection = await aio_pika.connect(s.url(), timeout=REPLY_TIMEOUT_S)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(s.name(), durable=True)
            s.record("declared", queue.name, queue.declaration_result.message_count)
            message = aio_pika.Message(b"hello", headers={"k": "v"}, delivery_mode=2)
            confirmation = await channel.default_exchange.publish(message, s.name())
            s.record("confirmation", type(confirmation).__name__)
            got = await queue.get(timeout=REPLY_TIMEOUT_S)
            s.record("got", got.body, got.headers, got.redelivered, int(got.delivery_mode))
            await got.ack()
            s.record("empty", await queue.get(fail=False, timeout=REPLY_TIMEOUT_S))
            s.record("deleted", (await queue.delete()).message_count)

    run_async(s, body)


@scenario("aio-pika: queue iterator, then cancel")
def _aio_iterator(s: Session) -> None:
    async def body() -> None:
        connection = await aio_pika.connect(s.url(), timeout=REPLY_TIMEOUT_S)
        async with connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=2)
            queue = await channel.declare_queue(s.name())
            for text in (b"a", b"b", b"c"):
                await channel.default_exchange.publish(aio_pika.Message(text), s.name())
            seen = []
            async with queue.iterator() as messages:
                async for message in messages:
                    seen.append((message.body, message.redelivered))
                    await message.ack()
                    if len(seen) == 3:
                        break
            s.record("seen", seen)
            declared = await channel.declare_queue(s.name(), passive=True)
            result = declared.declaration_result
            s.record("after", result.message_count, result.consumer_count)

    run_async(s, body)


@scenario("aio-pika: consume with a callback, cancel, unacked go back")
def _aio_consume(s: Session) -> None:
    async def body() -> None:
        connection = await aio_pika.connect(s.url(), timeout=REPLY_TIMEOUT_S)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(s.name())
            two = asyncio.get_running_loop().create_future()
            seen: list[bytes] = []

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                seen.append(message.body)
                if len(seen) == 2 and not two.done():
                    two.set_result(None)

            tag = await queue.consume(on_message, consumer_tag="aio-tag")
            s.record("tag", tag)
            for text in (b"x", b"y"):
                await channel.default_exchange.publish(aio_pika.Message(text), s.name())
            await two
            s.record("seen", seen)
            cancel_ok = await queue.cancel(tag)
            s.record("cancel", type(cancel_ok).__name__, cancel_ok.consumer_tag)
            await channel.close()
            channel = await connection.channel()
            declared = await channel.declare_queue(s.name(), passive=True)
            s.record("requeued", declared.declaration_result.message_count)

    run_async(s, body)


@scenario("aio-pika: a nack from a full queue raises DeliveryError")
def _aio_nack(s: Session) -> None:
    async def body() -> None:
        connection = await aio_pika.connect(s.url(), timeout=REPLY_TIMEOUT_S)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(s.name(), arguments=FULL)
            exchange = channel.default_exchange
            for text in (b"kept", b"refused"):
                try:
                    confirmation = await exchange.publish(aio_pika.Message(text), s.name())
                    s.record(text, type(confirmation).__name__)
                except aio_pika.exceptions.DeliveryError as exc:
                    s.record(text, "DeliveryError", type(exc.frame).__name__)
            confirmation = await exchange.publish(aio_pika.Message(b"u"), s.name("nowhere"))
            s.record("unroutable", type(confirmation).__name__)

    run_async(s, body)


@scenario("aio-pika: a mandatory unroutable publish raises DeliveryError with the return")
def _aio_return(s: Session) -> None:
    async def body() -> None:
        connection = await aio_pika.connect(s.url(), timeout=REPLY_TIMEOUT_S)
        async with connection:
            channel = await connection.channel(on_return_raises=True)
            amq_direct = await channel.get_exchange("amq.direct")
            try:
                await amq_direct.publish(aio_pika.Message(b"back"), s.name("nowhere"))
                s.record("published")
            except aio_pika.exceptions.DeliveryError as exc:
                returned = exc.message
                s.record("DeliveryError", returned.body if returned is not None else None)

    run_async(s, body)


@scenario("aio-pika: channel errors: missing queue, inequivalent declare")
def _aio_errors(s: Session) -> None:
    async def body() -> None:
        connection = await aio_pika.connect(s.url(), timeout=REPLY_TIMEOUT_S)
        async with connection:
            channel = await connection.channel()
            try:
                await channel.declare_queue(s.name(), passive=True)
            except Exception as exc:
                s.record("passive", *described(exc))
            channel = await connection.channel()
            await channel.declare_queue(s.name(), durable=True)
            try:
                await channel.declare_queue(s.name(), durable=False)
            except Exception as exc:
                s.record("inequivalent", *described(exc))
            s.record("connection open", not connection.is_closed)

    run_async(s, body)


# py-amqp (kombu's transport).


def _amqp(s: Session, **options: Any) -> amqp.Connection:
    connection = amqp.Connection(
        f"127.0.0.1:{s.endpoint.amqp_port}", connect_timeout=REPLY_TIMEOUT_S, **options
    )
    connection.connect()
    s.cleanups.append(connection.close)
    return connection


# RabbitMQ sends queue.delete-ok, then basic.cancel: queue_delete returns 0 and the next
# call raises ConsumerCancelled.
@scenario("py-amqp: queue_delete of a queue consumed on the same channel")
def _amqp_delete_consumed(s: Session) -> None:
    connection = _amqp(s)
    ch = connection.channel()
    ch.queue_declare(s.name())
    ch.basic_publish(amqp.Message(b"one"), "", s.name())
    got: list[bytes] = []
    tag = ch.basic_consume(s.name(), callback=lambda message: got.append(message.body))
    connection.drain_events(timeout=REPLY_TIMEOUT_S)
    s.record("delivered", got)
    outcome(s, "delete", lambda: ch.queue_delete(s.name()))
    outcome(s, "cancel", lambda: ch.basic_cancel(tag))
    outcome(s, "declare", lambda: tuple(ch.queue_declare(s.name("other"))))


@scenario("py-amqp: basic_get and its delivery info")
def _amqp_get(s: Session) -> None:
    ch = _amqp(s).channel()
    ch.queue_declare(s.name())
    ch.basic_publish(amqp.Message(b"one", content_type="text/plain"), "", s.name())
    ch.basic_publish(amqp.Message(b"two"), "", s.name())
    message = ch.basic_get(s.name())
    info = message.delivery_info
    s.record("get", message.body, info["message_count"], info["redelivered"], message.properties)
    ch.basic_reject(message.delivery_tag, requeue=True)
    message = ch.basic_get(s.name(), no_ack=True)
    s.record("again", message.body, message.delivery_info["redelivered"])
    s.record("purged", ch.queue_purge(s.name()))
    s.record("empty", ch.basic_get(s.name()))


@scenario("py-amqp: publish with confirms: nack raises MessageNacked, unroutable is acked")
def _amqp_confirms(s: Session) -> None:
    ch = _amqp(s).channel()
    ch.queue_declare(s.name(), arguments=FULL)
    confirming = _amqp(s, confirm_publish=True).channel()
    for label, routing_key in (("kept", s.name()), ("refused", s.name()), ("no route", "nowhere")):
        try:
            confirming.basic_publish(amqp.Message(label.encode()), "", routing_key)
            s.record(label, "confirmed")
        except Exception as exc:
            s.record(label, *described(exc))
    outcome(s, "passive", lambda: tuple(ch.queue_declare(s.name(), passive=True)))
    outcome(s, "missing", lambda: ch.queue_declare(s.name("missing"), passive=True))


# kombu (over py-amqp).


@scenario("kombu: SimpleQueue put and get, then empty")
def _kombu_simple(s: Session) -> None:
    with kombu.Connection(s.url(), connect_timeout=REPLY_TIMEOUT_S) as connection:
        queue = connection.SimpleQueue(s.name(), serializer="json")
        queue.put({"n": 1})
        queue.put({"n": 2})
        for _ in range(2):
            message = queue.get(timeout=REPLY_TIMEOUT_S)
            info = message.delivery_info
            s.record("got", message.payload, message.content_type, info["redelivered"])
            message.ack()
        try:
            queue.get(timeout=0.1)
            s.record("not empty")
        except queue.Empty:
            s.record("empty")
        s.record("size", queue.qsize())
        queue.close()


@scenario("kombu: publish with confirms to a full reject-publish queue")
def _kombu_confirms(s: Session) -> None:
    options = {"confirm_publish": True}
    url = s.url()
    with kombu.Connection(url, connect_timeout=REPLY_TIMEOUT_S, transport_options=options) as c:
        producer = c.Producer()
        kombu.Queue(s.name(), queue_arguments=FULL, durable=False)(producer.channel).declare()
        for body, routing_key in (("kept", s.name()), ("refused", s.name()), ("u", "nowhere")):
            try:
                producer.publish(body, routing_key=routing_key)
                s.record(body, "confirmed")
            except Exception as exc:
                s.record(body, *described(exc))
