"""One connected run of a shovel: from opening its source and destination to the first
failure, or to the end of `src-delete-after`.

Owns `ShovelSession`: it consumes from the source, hands each batch of deliveries to the
destination in one go, and acks the source as the ack mode says (shovel_transfer.py keeps
the numbers). A session is never reused: on any failure the shovel (shovels.py) closes it
and opens a new one after its reconnect-delay, and the source gets back what was not acked
(at-least-once for on-confirm and on-publish).

Acks go out from one task per session, at most once per event-loop turn: a read full of
confirms, or of deliveries in on-publish mode, becomes one `basic.ack multiple`. In
on-publish mode that task first waits until the destination's socket can take more, so a
slow destination slows the source down through the prefetch window instead of filling
memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final, Protocol, cast

from amqp_gateway.codec.values import FieldTable
from streamq.broker.link_definitions import ShovelDefinition
from streamq.links.amqp.client import AmqpConnectionError, Delivery
from streamq.links.shovel_endpoints import (
    Opener,
    Source,
    close_quietly,
    endpoint_fields,
    is_http,
    open_amqp_destination,
    open_source,
)
from streamq.links.shovel_headers import forward_record
from streamq.links.shovel_transfer import Transfer

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S: Final = 5.0
DONE: Final = "done"  # the session's outcome when src-delete-after was reached


class Destination(Protocol):
    uri: str
    closed: asyncio.Future[None]

    def forward(self, deliveries: list[Delivery]) -> None: ...
    async def writable(self) -> None: ...
    async def close(self) -> None: ...


class ShovelSession:
    """One run of a shovel between connecting and the first failure."""

    def __init__(
        self,
        definition: ShovelDefinition,
        vhost: str,
        name: str,
        node: str,
        on_forwarded: Callable[[int], None],
    ) -> None:
        self.definition = definition
        self.vhost = vhost
        self.name = name
        self.node = node
        self.on_forwarded = on_forwarded  # called with each batch's count
        self.source: Source | None = None
        self.destination: Destination | None = None
        self.transfer = Transfer(None)
        self._acks_due = asyncio.Event()
        self._ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._acker: asyncio.Task[None] | None = None

    @property
    def blocked(self) -> bool:
        destination = self.destination
        connection = getattr(destination, "connection", None)
        return bool(getattr(connection, "blocked", False))

    async def run(self, opener: Opener, on_running: Callable[[], None]) -> str:
        """Open both ends, move messages until one fails or the work is done: DONE, or
        raises AmqpConnectionError / HttpDestinationError with the reason."""
        self.source = await open_source(opener, self.definition, self.name)
        self.transfer = Transfer(self._limit(self.source.messages))
        if self.transfer.remaining == 0:
            return DONE  # queue-length of an empty queue: nothing to move
        self.destination = await self._open_destination(opener)
        self._acker = asyncio.get_running_loop().create_task(self._send_acks())
        self.source.consumer_tag = await self.source.channel.consume(
            self.source.queue,
            self._on_deliveries,
            no_ack=self.definition.ack_mode == "no-ack",
            arguments=cast("FieldTable", dict(self.definition.src_consumer_args)) or None,
        )
        on_running()
        watched: set[asyncio.Future[Any]] = {
            self.source.connection.closed,
            self.source.channel.closed,
            self.destination.closed,
            self._ended,
            self._acker,
        }
        done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        for finished in done:
            error = None if finished.cancelled() else finished.exception()
            if error is not None:
                raise error
        if self._ended in done:
            return DONE
        raise AmqpConnectionError("the source or the destination closed")

    def _limit(self, messages: int) -> int | None:
        after = self.definition.src_delete_after
        if after == "never":
            return None
        if after == "queue-length":
            return messages
        assert isinstance(after, int)
        return after

    async def _open_destination(self, opener: Opener) -> Destination:
        assert self.source is not None
        uris = self.definition.dest_uris
        destination: Destination
        if is_http(uris[0]):
            # aiohttp's client is imported by the first HTTP shovel, not at broker start.
            from streamq.links.shovel_http import HttpDestination  # noqa: PLC0415

            destination = HttpDestination(uris[0], self.name, self._on_confirm)
        else:
            destination = await open_amqp_destination(
                opener, self.definition, self.name, self._on_confirm
            )
            if self.definition.dest_add_forward_headers:
                fields = endpoint_fields(self.definition, self.source.uri, destination.uri)
                destination.add_forward_headers(
                    forward_record(self.name, self.vhost, self.node, fields)
                )
        return destination

    def _on_deliveries(self, deliveries: list[Delivery]) -> None:
        # The hot path: one call per read of the source socket.
        count = self.transfer.take(len(deliveries), deliveries[0].delivery_tag)
        if count == 0:
            return  # beyond src-delete-after: left unacked, requeued when we close
        assert self.destination is not None
        try:
            self.destination.forward(deliveries if count == len(deliveries) else deliveries[:count])
        except (AmqpConnectionError, ValueError) as exc:
            # The destination's channel closed under us, or a message it cannot carry:
            # the session ends and what was not acked goes back to the source.
            if not self._ended.done():
                self._ended.set_exception(AmqpConnectionError(f"publish failed: {exc}"))
            return
        self.on_forwarded(count)
        if self.definition.ack_mode != "on-confirm":
            # on-publish: acked once written (the acker waits for the socket); no-ack:
            # nothing to ack, but the count of what is settled drives delete-after.
            self.transfer.confirm(self.transfer.forwarded, True, True)
            self._acks_due.set()

    def _on_confirm(self, sequence: int, multiple: bool, ack: bool) -> None:
        self.transfer.confirm(sequence, multiple, ack)
        self._acks_due.set()

    async def _send_acks(self) -> None:
        assert self.source is not None and self.destination is not None
        channel = self.source.channel
        no_ack = self.definition.ack_mode == "no-ack"
        while True:
            await self._acks_due.wait()
            self._acks_due.clear()
            if self.definition.ack_mode == "on-publish":
                await self.destination.writable()
            tag, refused = self.transfer.pending_acks()
            if not no_ack:
                for refused_tag in refused:
                    channel.nack(refused_tag, requeue=True)
                if tag is not None:
                    channel.ack(tag, multiple=True)
            if self.transfer.remaining == 0:
                await self._finish_if_done()

    async def _finish_if_done(self) -> None:
        """Once the last message of src-delete-after is settled: stop consuming and end."""
        assert self.source is not None
        if self.transfer.done and not self._ended.done():
            await self.source.channel.cancel(self.source.consumer_tag)
            self._ended.set_result(DONE)

    async def close(self) -> None:
        """Close both ends (what the source delivered and we did not ack goes back to its
        queue); waits CLOSE_TIMEOUT_S at most for each."""
        if self._acker is not None:
            self._acker.cancel()
            await asyncio.gather(self._acker, return_exceptions=True)
        if self.destination is not None:
            await close_quietly(self.destination.close, CLOSE_TIMEOUT_S)
        if self.source is not None:
            await close_quietly(self.source.connection.close, CLOSE_TIMEOUT_S)
