"""Where a shovel connects: its URIs turned into connections, and the source and AMQP
destination ends set up on them as RabbitMQ's shovel sets them up.

Owns `Opener` (a list of URIs tried in order, `amqp://` with no host meaning this broker
through the gateway's direct connector), `open_source` (the queue to consume from, its
length, the consumer) and `AmqpDestination` (where deliveries are published). It must not
decide when to reconnect (shovels.py) nor which deliveries to ack (shovel_transfer.py).

Declarations follow rabbit_shovel_parameters (3.10): a `src-queue` or `dest-queue` is
declared passively and, if missing, declared durable on a fresh channel; a `src-exchange`
gets a server-named exclusive queue bound with `src-exchange-key`; a `dest-exchange` is
not declared.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from amqp_gateway.codec.values import FieldValue
from amqp_gateway.errors import AMQPSyntaxError
from streamq.broker.link_definitions import ShovelDefinition, redact_uri
from streamq.links.amqp.client import (
    AmqpConnectionError,
    Channel,
    ChannelClosedError,
    Connection,
    Delivery,
    DirectConnector,
)
from streamq.links.amqp.uri import UriInvalid, parse_uri
from streamq.links.shovel_headers import add_headers

logger = logging.getLogger(__name__)


class DestinationError(Exception):
    """A destination refused a message or could not be reached (not an AMQP failure)."""


def is_http(uri: str) -> bool:
    """LavinMQ's HTTP destination: a dest-uri of http:// or https://."""
    return urllib.parse.urlsplit(uri).scheme in ("http", "https")


# A URI that names no vhost (RabbitMQ's amqp_uri:parse/2 default) means the shovel's own.
NO_PATH: Final = ""


class Opener:
    """Connections for one shovel: each URI of a list tried in order."""

    def __init__(self, direct: DirectConnector | None, vhost: str, user: str) -> None:
        self.direct = direct
        self.vhost = vhost  # the shovel's vhost: that of a URI without a path
        self.user = user  # the direct connections' user (the parameter's owner)

    async def connect(self, texts: Sequence[str], name: str) -> tuple[Connection, str]:
        """The first of `texts` that connects, and its text. Raises AmqpConnectionError
        (with every URI's reason, passwords redacted) when none does."""
        reasons = []
        for text in texts:
            try:
                uri = parse_uri(text)
                if urllib.parse.urlsplit(text).path == NO_PATH:
                    uri = dataclasses.replace(uri, vhost=self.vhost)
                if uri.local:
                    uri = dataclasses.replace(uri, username=self.user)
                connection = await Connection.connect(uri, name=name, direct=self.direct)
                return connection, text
            except (AmqpConnectionError, UriInvalid, OSError) as exc:
                reasons.append(f"{redact_uri(text)}: {exc}")
        raise AmqpConnectionError("; ".join(reasons))


async def ensure_queue(connection: Connection, channel: Channel, name: str) -> tuple[Channel, int]:
    """Declare `name` passively, or durable if it is missing (RabbitMQ's ensure_queue):
    (a usable channel, the queue's message count). Raises AmqpConnectionError."""
    try:
        _, messages, _ = await channel.declare_queue(name, passive=True)
        return channel, messages
    except ChannelClosedError:
        channel = await connection.channel()  # a failed passive declare closed the first
        _, messages, _ = await channel.declare_queue(name, durable=True)
        return channel, messages


@dataclasses.dataclass
class Source:
    """The consuming end of a session."""

    connection: Connection
    channel: Channel
    uri: str
    queue: str
    messages: int  # the queue's length when the shovel started (for queue-length)
    consumer_tag: str = ""


async def open_source(opener: Opener, definition: ShovelDefinition, name: str) -> Source:
    """Connect to the source, declare what it consumes from and set its prefetch (the
    consumer is started by the session). Raises AmqpConnectionError."""
    connection, text = await opener.connect(definition.src_uris, f"Shovel {name}")
    try:
        channel = await connection.channel()
        if definition.src_queue is not None:
            channel, messages = await ensure_queue(connection, channel, definition.src_queue)
            queue = definition.src_queue
        else:
            queue, messages, _ = await channel.declare_queue("", durable=False, exclusive=True)
            assert definition.src_exchange is not None  # the definition has one or the other
            await channel.bind_queue(queue, definition.src_exchange, definition.src_exchange_key)
        if definition.ack_mode != "no-ack":
            await channel.qos(definition.src_prefetch_count)
    except BaseException:
        await connection.close()
        raise
    return Source(connection, channel, text, queue, messages)


def endpoint_fields(definition: ShovelDefinition, src_uri: str, dest_uri: str) -> dict[str, str]:
    """The source and destination as x-shovelled names them (URIs without passwords)."""
    fields = {"src-uri": redact_uri(src_uri)}
    if definition.src_queue is not None:
        fields["src-queue"] = definition.src_queue
    else:
        fields["src-exchange"] = definition.src_exchange or ""
        fields["src-exchange-key"] = definition.src_exchange_key
    fields["dest-uri"] = redact_uri(dest_uri)
    if definition.dest_queue is not None:
        fields["dest-queue"] = definition.dest_queue
    elif definition.dest_exchange is not None:
        fields["dest-exchange"] = definition.dest_exchange
        if definition.dest_exchange_key is not None:
            fields["dest-exchange-key"] = definition.dest_exchange_key
    return fields


class AmqpDestination:
    """The publishing end of a session: every delivery published once, in order, with
    its own properties (and the shovel's headers when asked)."""

    def __init__(
        self,
        connection: Connection,
        channel: Channel,
        uri: str,
        definition: ShovelDefinition,
    ) -> None:
        self.connection = connection
        self.channel = channel
        self.uri = uri
        # The channel ends with its connection too; a publish the destination refuses
        # (an exchange that does not exist) ends the channel alone.
        self.closed = channel.closed
        self._definition = definition
        self._forward: Mapping[str, FieldValue] | None = None
        self._exchange = definition.dest_exchange
        self._routing_key = definition.dest_exchange_key
        if definition.dest_queue is not None:
            self._exchange, self._routing_key = "", definition.dest_queue

    def add_forward_headers(self, record: Mapping[str, FieldValue]) -> None:
        self._forward = record

    def forward(self, deliveries: Sequence[Delivery]) -> None:
        """Publish `deliveries` (the client writes them in one go)."""
        rewrite = self._forward is not None or self._definition.dest_add_timestamp_header
        now_s = int(time.time()) if self._definition.dest_add_timestamp_header else None
        publish = self.channel.publish
        for delivery in deliveries:
            properties = delivery.properties
            if rewrite:
                properties = _with_headers(properties, self._forward, now_s)
            publish(
                delivery.exchange if self._exchange is None else self._exchange,
                delivery.routing_key if self._routing_key is None else self._routing_key,
                properties,
                delivery.body,
            )

    async def writable(self) -> None:
        await self.channel.writable()

    async def close(self) -> None:
        await self.connection.close()


def _with_headers(
    properties: bytes, forward: Mapping[str, FieldValue] | None, now_s: int | None
) -> bytes:
    try:
        return add_headers(properties, forward, now_s)
    except AMQPSyntaxError:
        return properties  # forwarded as it came: the source accepted it so


async def open_amqp_destination(
    opener: Opener,
    definition: ShovelDefinition,
    name: str,
    on_confirm: Callable[[int, bool, bool], None],
) -> AmqpDestination:
    """Connect to the destination, declare its queue if it names one and select confirms
    for on-confirm. Raises AmqpConnectionError."""
    connection, text = await opener.connect(definition.dest_uris, f"Shovel {name}")
    try:
        channel = await connection.channel()
        if definition.dest_queue is not None:
            channel, _ = await ensure_queue(connection, channel, definition.dest_queue)
        if definition.ack_mode == "on-confirm":
            await channel.confirm_select()
            channel.on_confirm = on_confirm
    except BaseException:
        await connection.close()
        raise
    return AmqpDestination(connection, channel, text, definition)


async def close_quietly(closing: Callable[[], object], timeout_s: float) -> None:
    """Await `closing()` for at most `timeout_s`; a failure to close is only logged (the
    peer may be gone: its connection is dropped either way)."""
    try:
        result = closing()
        if asyncio.iscoroutine(result):
            await asyncio.wait_for(result, timeout_s)
    except (AmqpConnectionError, OSError, TimeoutError) as exc:
        logger.debug("close: %s", exc)
