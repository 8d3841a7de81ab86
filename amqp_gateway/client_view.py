"""What the AMQP gateway publishes to the broker for the management API.

Owns `AmqpClient`, the `streamq.broker.clients.Client` view of one connection (snapshots
of its channels and consumers, taken when the API asks), and `AmqpPropertiesJson`, basic
properties to and from RabbitMQ's management JSON. Nothing here runs per message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Final

from amqp_gateway import codec
from amqp_gateway.errors import AMQPError
from streamq.broker.clients import ChannelInfo, ConsumerInfo
from streamq.tls_peer import transport_tls_fields

if TYPE_CHECKING:
    from amqp_gateway.channels import Unacked
    from amqp_gateway.session import AmqpSession

PROPERTY_NAMES: Final = frozenset(f.name for f in dataclasses.fields(codec.BasicProperties))
INT_PROPERTIES: Final = frozenset({"delivery_mode", "priority", "timestamp"})


class AmqpClient:
    """A registered connection: reads its session's state when asked."""

    def __init__(self, session: AmqpSession, local: tuple[str, int], peer: tuple[str, int]):
        self._session = session
        self.host, self.port = local
        self.peer_host, self.peer_port = peer
        self.name = f"{self.peer_host}:{self.peer_port} -> {self.host}:{self.port}"
        # RabbitMQ's connection type: "direct" for the broker's own links (direct.py).
        self.connection_type = "direct" if session.direct_user is not None else "network"
        self.protocol = "AMQP 0-9-1"
        self.connected_at_ms = session.connected_at_ms
        self.tls = transport_tls_fields(session.transport)

    @property
    def vhost(self) -> str:
        return self._session.conn.virtual_host

    @property
    def user(self) -> str:
        return self._session.user

    @property
    def client_properties(self) -> Mapping[str, object]:
        return _json_table(self._session.conn.client_properties)

    @property
    def frame_max(self) -> int:
        return self._session.conn.frame_max

    @property
    def channel_max(self) -> int:
        return self._session.conn.channel_max

    @property
    def heartbeat_s(self) -> int:
        return self._session.conn.heartbeat_s

    @property
    def recv_oct(self) -> int:
        return self._session.recv_oct

    @property
    def send_oct(self) -> int:
        return self._session.send_oct

    @property
    def blocked(self) -> bool:
        return self._session.blocked_by_alarm

    @property
    def state(self) -> str:
        return self._session.state

    @property
    def auth_mechanism(self) -> str:
        return self._session.auth_mechanism

    def channels(self) -> list[ChannelInfo]:
        session = self._session
        connection_state = session.state
        out = []
        for number, channel in sorted(session.channels.items()):
            consumers = tuple(
                ConsumerInfo(
                    tag=c.tag,
                    queue=c.queue.name,
                    ack_required=not c.no_ack,
                    exclusive=c.exclusive,
                    prefetch_count=c.prefetch,
                    arguments={"x-priority": c.priority} if c.priority else {},
                    activity_status=c.queue.activity_status(c),
                )
                for c in channel.consumers.values()
            )
            closing = connection_state == "closing" or session.conn.is_channel_closing(number)
            out.append(
                ChannelInfo(
                    number=number,
                    prefetch_count=channel.consumer_prefetch,
                    global_prefetch_count=channel.channel_prefetch,
                    confirm=channel.confirm,
                    transactional=channel.transactional,
                    messages_unacknowledged=len(channel.unacked),
                    messages_unconfirmed=channel.publish_seq - channel.confirmed_seq,
                    consumers=consumers,
                    messages_uncommitted=len(channel.tx_publishes),
                    acks_uncommitted=_acks_held(channel.tx_acks),
                    # Flow control holds the whole connection, hence each of its channels.
                    state="closing"
                    if closing
                    else "flow"
                    if connection_state == "flow"
                    else "running",
                )
            )
        return out

    def close(self, reason: str) -> None:
        self._session.force_close(reason, wait_close_ok=True)

    def cancel_consumer(self, channel: int, tag: str) -> bool:
        session = self._session.channels.get(channel)
        consumer = session.consumers.get(tag) if session is not None else None
        if consumer is None:
            return False
        self._session.current_vhost().remove_consumer(consumer.queue, consumer)
        consumer.cancel_by_broker()
        return True


def _acks_held(tx_acks: list[tuple[dict[int, Unacked], bool, bool]]) -> int:
    """The messages the open transaction acks (RabbitMQ's `acks_uncommitted` counts
    basic.ack only: the nacks and rejects it holds are not in it)."""
    return sum(len(held) for held, ack, _ in tx_acks if ack)


def _json_value(value: object) -> object:
    if isinstance(value, dict):
        return _json_table(value)
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "surrogateescape")
    if isinstance(value, Decimal):
        return float(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _json_table(table: Mapping[str, object]) -> dict[str, object]:
    return {str(k): _json_value(v) for k, v in table.items()}


class AmqpPropertiesJson:
    def to_json(self, properties_raw: bytes) -> dict[str, object]:
        try:
            properties = codec.decode_properties(properties_raw)
        except AMQPError:
            return {}
        out: dict[str, object] = {}
        for name in PROPERTY_NAMES:
            value = getattr(properties, name)
            if value is not None:
                out[name] = _json_value(value)
        return out

    def from_json(self, properties: Mapping[str, object]) -> bytes:
        values: dict[str, object] = {}
        for name, value in properties.items():
            if name not in PROPERTY_NAMES:
                raise ValueError(f"unknown property {name!r}")
            if name == "headers":
                if not isinstance(value, dict):
                    raise ValueError("headers must be an object")
            elif name in INT_PROPERTIES:
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ValueError(f"{name} must be a non-negative integer")
            elif not isinstance(value, str):
                raise ValueError(f"{name} must be a string")
            values[name] = value
        try:
            return codec.encode_properties(codec.BasicProperties(**values))  # type: ignore[arg-type]  # checked above
        except (ValueError, TypeError, OverflowError) as exc:
            raise ValueError(str(exc)) from None

    def headers(self, properties_raw: bytes) -> Mapping[str, object] | None:
        try:
            return codec.decode_properties(properties_raw).headers
        except AMQPError:
            return None
