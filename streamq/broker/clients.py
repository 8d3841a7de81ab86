"""The broker's registry of client connections, as the management API shows them.

Owns what a gateway publishes about its connections (`Client`: who, from where, which
channels and consumers) so that another gateway (HTTP) can list and close them without
importing the first. The AMQP gateway registers each connection in `Broker.clients` once
it is open and removes it when it closes. Views are snapshots taken on request (never on
the hot path). Also owns `PropertiesJson`, the AMQP gateway's translation of message
properties to and from JSON (for publishing and getting messages over HTTP).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """One basic.consume, as RabbitMQ's consumer_details lists it."""

    tag: str
    queue: str
    ack_required: bool
    exclusive: bool
    prefetch_count: int
    arguments: Mapping[str, object]
    # RabbitMQ 3.10's `activity_status` (`Queue.activity_status`): "up", or on a
    # single-active-consumer queue "single_active" and "waiting"; `active` is false
    # only for "waiting".
    activity_status: str = "up"

    @property
    def active(self) -> bool:
        return self.activity_status != "waiting"


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """One open channel of a connection."""

    number: int
    prefetch_count: int  # basic.qos global=false (per consumer)
    global_prefetch_count: int  # basic.qos global=true
    confirm: bool
    transactional: bool
    messages_unacknowledged: int
    messages_unconfirmed: int
    consumers: tuple[ConsumerInfo, ...]
    # The open transaction (tx.select): the publishes, and the messages basic.ack
    # acknowledged, that tx.commit will apply (RabbitMQ's counts: the nacks and rejects
    # it holds are not in acks_uncommitted).
    messages_uncommitted: int = 0
    acks_uncommitted: int = 0
    state: str = "running"  # RabbitMQ's channel states: "running", "flow", "closing"


class Client(Protocol):
    """A client connection a gateway registered in `Broker.clients` (by `name`)."""

    @property
    def name(self) -> str:
        """RabbitMQ's connection name: "127.0.0.1:54321 -> 127.0.0.1:5672"."""

    @property
    def vhost(self) -> str: ...

    @property
    def user(self) -> str: ...

    @property
    def protocol(self) -> str:
        """ "AMQP 0-9-1"."""

    @property
    def host(self) -> str:
        """The broker's address of the connection."""

    @property
    def port(self) -> int: ...

    @property
    def peer_host(self) -> str: ...

    @property
    def peer_port(self) -> int: ...

    @property
    def connected_at_ms(self) -> int:
        """Epoch milliseconds."""

    @property
    def client_properties(self) -> Mapping[str, object]: ...

    @property
    def frame_max(self) -> int: ...

    @property
    def channel_max(self) -> int: ...

    @property
    def heartbeat_s(self) -> int: ...

    @property
    def recv_oct(self) -> int:
        """Bytes received so far."""

    @property
    def send_oct(self) -> int:
        """Bytes sent so far."""

    @property
    def blocked(self) -> bool:
        """A resource alarm blocks this publisher."""

    @property
    def state(self) -> str:
        """RabbitMQ's connection state: "running"; "blocking" (an alarm is on, the
        connection has not published since) and "blocked" (it published and is no longer
        read); "flow" (held by publisher flow control); "closing"."""

    @property
    def auth_mechanism(self) -> str:
        """The SASL mechanism of its login: "PLAIN", "AMQPLAIN", "EXTERNAL"."""

    @property
    def tls(self) -> Mapping[str, object] | None:
        """RabbitMQ's ssl_* and peer_cert_* fields of a TLS connection; None over plain
        TCP, a unix socket or plain WebSocket."""

    def channels(self) -> list[ChannelInfo]:
        """The open channels, by number."""

    def close(self, reason: str) -> None:
        """Close with 320 CONNECTION_FORCED and `reason` (RabbitMQ's management close)."""

    def cancel_consumer(self, channel: int, tag: str) -> bool:
        """Cancel consumer `tag` of `channel` as the broker does when its queue goes: the
        client gets basic.cancel (consumer_cancel_notify); its unacked deliveries stay
        with the channel. False if there is no such consumer."""


class PropertiesJson(Protocol):
    """AMQP basic properties to and from RabbitMQ's management JSON (`delivery_mode`,
    `headers`, ...); the AMQP gateway sets one on the broker."""

    def to_json(self, properties_raw: bytes) -> dict[str, object]:
        """The properties present, by RabbitMQ's JSON names."""

    def from_json(self, properties: Mapping[str, object]) -> bytes:
        """The wire form. Raises ValueError for an unknown name or a bad value."""

    def headers(self, properties_raw: bytes) -> Mapping[str, object] | None:
        """The `headers` table, for routing by a headers exchange."""
