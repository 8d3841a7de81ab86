"""One channel of an outbound connection: synchronous calls, consumers, publishes, confirms.

Owns `Channel`: the declare/bind/qos/confirm/consume calls, each waiting for its reply
(replies come in order on a channel, AMQP 0-9-1 section 2.3.5, so pending calls wait in
a FIFO), the consumers and the batches of deliveries handed to them, publishes with
their sequence numbers once in confirm mode, acks and nacks, and the broker's
channel.flow, channel.close and basic.cancel. Bytes go through the connection's output
buffer (`Connection.output`), flushed once per event-loop turn; nothing here touches
the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, TypeVar

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from streamq.links.amqp.errors import AmqpConnectionError, ChannelClosedError, mark_retrieved
from streamq.links.amqp.wire import Delivery, DeliveryRun

if TYPE_CHECKING:
    from streamq.links.amqp.client import Connection

logger = logging.getLogger(__name__)

CALLS_PENDING_MAX: Final = 1024
"""Synchronous calls waiting for their replies on one channel."""
_M = TypeVar("_M", bound=m.Method)
_consumer_numbers = itertools.count(1)
DeliveryHandler = Callable[[list[Delivery]], None]
Arguments = dict[str, codec.FieldValue]


class Channel:
    """An open channel. Use `Connection.channel()` to make one."""

    def __init__(self, connection: Connection, channel_id: int) -> None:
        self.connection = connection
        self.id = channel_id
        self._calls: deque[tuple[type[m.Method], asyncio.Future[m.Method]]] = deque()
        self._consumers: dict[str, DeliveryHandler] = {}
        self.publish_seq = 0  # the last publish's sequence number, in confirm mode
        self.confirming = False
        self.flow_active = True  # channel.flow from the broker
        self._flow = asyncio.Event()
        self._flow.set()
        self.on_confirm: Callable[[int, bool, bool], None] | None = None
        self.on_cancel: Callable[[str], None] | None = None  # else a cancel closes us
        self.on_return: Callable[[m.BasicReturn, bytes, bytes], None] | None = None
        self.closed: asyncio.Future[None] = connection.loop.create_future()
        self.closed.add_done_callback(mark_retrieved)

    # -- synchronous calls -------------------------------------------------------------

    async def call(self, method: m.Method, reply: type[_M]) -> _M:
        """Send `method` and wait for `reply`. Raises ChannelClosedError or
        AmqpConnectionError when the channel or connection closes first."""
        self._check_open()
        if len(self._calls) >= CALLS_PENDING_MAX:
            raise AmqpConnectionError(f"more than {CALLS_PENDING_MAX} calls pending")
        future: asyncio.Future[m.Method] = self.connection.loop.create_future()
        self._calls.append((reply, future))
        self.connection.send_method(self.id, method)
        result = await future
        assert isinstance(result, reply), "replies are checked when they arrive"
        return result

    async def declare_queue(
        self,
        name: str,
        *,
        passive: bool = False,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: Arguments | None = None,
    ) -> tuple[str, int, int]:
        """(name, messages, consumers) of the queue declared."""
        method = m.QueueDeclare(
            queue=name,
            passive=passive,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments or {},
        )
        ok = await self.call(method, m.QueueDeclareOk)
        return ok.queue, ok.message_count, ok.consumer_count

    async def declare_exchange(
        self,
        name: str,
        kind: str,
        *,
        passive: bool = False,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Arguments | None = None,
    ) -> None:
        method = m.ExchangeDeclare(
            exchange=name,
            type=kind,
            passive=passive,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments or {},
        )
        await self.call(method, m.ExchangeDeclareOk)

    async def bind_queue(
        self, queue: str, exchange: str, routing_key: str, arguments: Arguments | None = None
    ) -> None:
        method = m.QueueBind(
            queue=queue, exchange=exchange, routing_key=routing_key, arguments=arguments or {}
        )
        await self.call(method, m.QueueBindOk)

    async def unbind_queue(
        self, queue: str, exchange: str, routing_key: str, arguments: Arguments | None = None
    ) -> None:
        method = m.QueueUnbind(
            queue=queue, exchange=exchange, routing_key=routing_key, arguments=arguments or {}
        )
        await self.call(method, m.QueueUnbindOk)

    async def bind_exchange(
        self, destination: str, source: str, routing_key: str, arguments: Arguments | None = None
    ) -> None:
        method = m.ExchangeBind(
            destination=destination,
            source=source,
            routing_key=routing_key,
            arguments=arguments or {},
        )
        await self.call(method, m.ExchangeBindOk)

    async def unbind_exchange(
        self, destination: str, source: str, routing_key: str, arguments: Arguments | None = None
    ) -> None:
        method = m.ExchangeUnbind(
            destination=destination,
            source=source,
            routing_key=routing_key,
            arguments=arguments or {},
        )
        await self.call(method, m.ExchangeUnbindOk)

    async def delete_queue(
        self, name: str, *, if_unused: bool = False, if_empty: bool = False
    ) -> int:
        """The number of messages deleted with the queue."""
        method = m.QueueDelete(queue=name, if_unused=if_unused, if_empty=if_empty)
        return (await self.call(method, m.QueueDeleteOk)).message_count

    async def qos(self, prefetch_count: int) -> None:
        """Per-consumer prefetch (global=false): the broker sends at most this many
        unacked deliveries to each consumer of this channel."""
        await self.call(m.BasicQos(prefetch_count=prefetch_count), m.BasicQosOk)

    async def confirm_select(self) -> None:
        await self.call(m.ConfirmSelect(), m.ConfirmSelectOk)
        self.confirming = True

    async def consume(
        self,
        queue: str,
        on_deliveries: DeliveryHandler,
        *,
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: Arguments | None = None,
    ) -> str:
        """Start a consumer; `on_deliveries` gets the deliveries of each read in one list.
        Returns the consumer tag."""
        tag = f"streamq.link-{next(_consumer_numbers)}"
        # Registered before consume-ok: deliveries may follow it in the same read.
        self._consumers[tag] = on_deliveries
        method = m.BasicConsume(
            queue=queue,
            consumer_tag=tag,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=arguments or {},
        )
        try:
            await self.call(method, m.BasicConsumeOk)
        except BaseException:
            self._consumers.pop(tag, None)
            raise
        return tag

    async def cancel(self, consumer_tag: str) -> None:
        await self.call(m.BasicCancel(consumer_tag=consumer_tag), m.BasicCancelOk)
        self._consumers.pop(consumer_tag, None)

    async def close(self) -> None:
        """Close the channel (200); its unacked deliveries go back to their queues."""
        if self.closed.done():
            return
        # AmqpConnectionError: closed meanwhile, by the broker or with the connection.
        with contextlib.suppress(AmqpConnectionError):
            await self.call(m.ChannelClose(200, "Goodbye", 0, 0), m.ChannelCloseOk)
        self._finish(None)

    # -- per message ---------------------------------------------------------------------

    def publish(
        self,
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes,
        *,
        mandatory: bool = False,
    ) -> int:
        """Queue a publish for this loop turn's write; its sequence number once
        `confirm_select` ran, else 0. Raises the channel's error once it is closed, and
        ValueError for a name over 255 bytes or properties over one frame."""
        self._check_open()
        connection = self.connection
        connection.writer.append(
            connection.output, self.id, exchange, routing_key, properties, body, mandatory
        )
        connection.note_output()
        if self.confirming:
            self.publish_seq += 1
            return self.publish_seq
        return 0

    def ack(self, delivery_tag: int, *, multiple: bool = False) -> None:
        if self.closed.done():
            return  # the broker requeued what this channel held when it closed
        codec.append_basic_ack(
            self.connection.output,
            codec.ChannelId(self.id),
            codec.DeliveryTag(delivery_tag),
            multiple,
        )
        self.connection.note_output()

    def nack(self, delivery_tag: int, *, multiple: bool = False, requeue: bool = True) -> None:
        if self.closed.done():
            return
        nack = m.BasicNack(codec.DeliveryTag(delivery_tag), multiple, requeue)
        self.connection.send_method(self.id, nack)

    async def writable(self) -> None:
        """Return once the connection may take more publishes (its write buffer is below
        the high-water mark, no connection.blocked) and channel.flow allows them. Raises
        the channel's or connection's error if it closes first."""
        await self.connection.writable()
        while not self._flow.is_set():
            self._check_open()
            await self._flow.wait()
        self._check_open()

    # -- from the connection -------------------------------------------------------------

    def take_run(self, run: DeliveryRun) -> None:
        handler = self._consumers.get(run.consumer_tag)
        if handler is None:
            return  # cancelled by us; the broker requeues these when the channel closes
        handler(run.deliveries)

    def take_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        if self.on_confirm is not None:
            self.on_confirm(delivery_tag, multiple, ack)

    def take_method(self, method: m.Method) -> None:
        """A method from the broker other than deliveries and confirms. Raises
        AmqpConnectionError for a reply nobody waits for (a protocol error)."""
        if isinstance(method, m.ChannelClose):
            self.connection.send_method(self.id, m.ChannelCloseOk())
            self._finish(ChannelClosedError(method.reply_code, method.reply_text, self.id))
        elif isinstance(method, m.ChannelFlow):
            self._set_flow(method.active)
            self.connection.send_method(self.id, m.ChannelFlowOk(active=method.active))
        elif isinstance(method, m.BasicCancel):
            self._cancelled(method.consumer_tag)
        elif isinstance(method, m.BasicAck | m.BasicNack):
            pass  # a confirm decoded the slow way cannot happen: wire.scan takes them all
        else:
            self._reply(method)

    def _reply(self, method: m.Method) -> None:
        if not self._calls:
            raise AmqpConnectionError(f"unexpected {method.NAME} on channel {self.id}")
        expected, future = self._calls.popleft()
        if not isinstance(method, expected):
            raise AmqpConnectionError(
                f"{method.NAME} on channel {self.id} where {expected.NAME} was due"
            )
        if not future.done():
            future.set_result(method)

    def _cancelled(self, consumer_tag: str) -> None:
        """The broker cancelled a consumer (its queue was deleted, say): the handler is
        told, else the channel closes with the reason, so that its owner restarts."""
        self._consumers.pop(consumer_tag, None)
        if self.on_cancel is not None:
            self.on_cancel(consumer_tag)
            return
        error = ChannelClosedError(
            0, f"consumer {consumer_tag} was cancelled by the broker", self.id
        )
        self.connection.send_method(self.id, m.ChannelClose(200, "consumer cancelled", 0, 0))
        self._finish(error, close_ok_due=True)

    def _set_flow(self, active: bool) -> None:
        self.flow_active = active
        if active:
            self._flow.set()
        else:
            self._flow.clear()

    def _finish(self, error: AmqpConnectionError | None, *, close_ok_due: bool = False) -> None:
        """The channel is closed: fail what waits, wake writers, free its number (unless
        the broker still owes close-ok for a close we sent)."""
        if not self.closed.done():
            if error is None:
                self.closed.set_result(None)
            else:
                self.closed.set_exception(error)
        failure = error or ChannelClosedError(0, "channel closed", self.id)
        while self._calls:
            _, future = self._calls.popleft()
            if not future.done():
                future.set_exception(failure)
                future.add_done_callback(mark_retrieved)
        self._consumers.clear()
        self._flow.set()
        self.connection.forget_channel(self, keep_number=close_ok_due)

    def connection_closed(self, error: AmqpConnectionError | None) -> None:
        self._finish(error)

    def _check_open(self) -> None:
        if self.closed.done():
            error = self.closed.exception()
            raise error if error is not None else ChannelClosedError(0, "channel closed", self.id)
