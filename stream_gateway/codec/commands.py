"""Typed stream protocol commands: one frozen, slotted dataclass per command and direction.

A request class is named after the command (`Subscribe`); its answer adds `Response`
(`SubscribeResponse` is the plain `Response`, which only carries a code). One-way commands
(Publish, Deliver, Credit, StoreOffset, Heartbeat, MetadataUpdate, PublishConfirm,
PublishError) have no correlation id. This module owns the shapes, not the wire layouts
(`stream_gateway.codec.bodies`) nor the framing (`stream_gateway.codec.frames`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stream_gateway.codec.constants import VERSION_1, Key, OffsetType


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where a subscription starts: `value` is an offset (OFFSET) or epoch ms (TIMESTAMP)."""

    offset_type: OffsetType
    value: int | None = None


@dataclass(frozen=True, slots=True)
class PublishedMessage:
    """One message of a Publish: `filter_value` exists on the wire only in version 2."""

    publishing_id: int
    message: bytes
    filter_value: str | None = None


@dataclass(frozen=True, slots=True)
class PublishingError:
    publishing_id: int
    response_code: int


@dataclass(frozen=True, slots=True)
class Broker:
    reference: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class StreamMetadata:
    """A stream's leader and replicas, as indexes into MetadataResponse.brokers.

    RabbitMQ writes leader 0xFFFF and no replicas for a stream in error.
    """

    stream: str
    response_code: int
    leader_reference: int
    replica_references: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CommandVersion:
    key: int
    version_min: int
    version_max: int


@dataclass(frozen=True, slots=True)
class Command:
    """Base of every decoded command."""


@dataclass(frozen=True, slots=True)
class Response(Command):
    """A response that carries only its code: DeclarePublisher, DeletePublisher, Subscribe,
    Unsubscribe, Create, Delete and Close answer with this."""

    key: Key
    correlation_id: int
    response_code: int


@dataclass(frozen=True, slots=True)
class PeerProperties(Command):
    correlation_id: int
    properties: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PeerPropertiesResponse(Command):
    correlation_id: int
    response_code: int
    properties: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SaslHandshake(Command):
    """RabbitMQ's handshake request has no mechanism (PROTOCOL.adoc lists one; the broker
    and every client send only the correlation id)."""

    correlation_id: int


@dataclass(frozen=True, slots=True)
class SaslHandshakeResponse(Command):
    correlation_id: int
    response_code: int
    mechanisms: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SaslAuthenticate(Command):
    correlation_id: int
    mechanism: str
    data: bytes | None


@dataclass(frozen=True, slots=True)
class SaslAuthenticateResponse(Command):
    correlation_id: int
    response_code: int
    challenge: bytes = b""


@dataclass(frozen=True, slots=True)
class Tune(Command):
    """Sent by the server after authentication; 0 means no limit / no heartbeat."""

    frame_max: int
    heartbeat_s: int


@dataclass(frozen=True, slots=True)
class TuneResponse(Command):
    """The client's Tune, same layout with the response bit set."""

    frame_max: int
    heartbeat_s: int


@dataclass(frozen=True, slots=True)
class Open(Command):
    correlation_id: int
    vhost: str


@dataclass(frozen=True, slots=True)
class OpenResponse(Command):
    correlation_id: int
    response_code: int
    properties: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Close(Command):
    correlation_id: int
    closing_code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Heartbeat(Command):
    pass


@dataclass(frozen=True, slots=True)
class Create(Command):
    correlation_id: int
    stream: str
    arguments: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Delete(Command):
    correlation_id: int
    stream: str


@dataclass(frozen=True, slots=True)
class Metadata(Command):
    correlation_id: int
    streams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MetadataResponse(Command):
    correlation_id: int
    brokers: tuple[Broker, ...]
    streams: tuple[StreamMetadata, ...]


@dataclass(frozen=True, slots=True)
class MetadataUpdate(Command):
    response_code: int
    stream: str


@dataclass(frozen=True, slots=True)
class DeclarePublisher(Command):
    correlation_id: int
    publisher_id: int
    reference: str
    stream: str


@dataclass(frozen=True, slots=True)
class DeletePublisher(Command):
    correlation_id: int
    publisher_id: int


@dataclass(frozen=True, slots=True)
class Publish(Command):
    publisher_id: int
    messages: tuple[PublishedMessage, ...]
    version: int = VERSION_1


@dataclass(frozen=True, slots=True)
class PublishConfirm(Command):
    publisher_id: int
    publishing_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PublishError(Command):
    publisher_id: int
    errors: tuple[PublishingError, ...]


@dataclass(frozen=True, slots=True)
class QueryPublisherSequence(Command):
    correlation_id: int
    reference: str
    stream: str


@dataclass(frozen=True, slots=True)
class QueryPublisherSequenceResponse(Command):
    correlation_id: int
    response_code: int
    sequence: int


@dataclass(frozen=True, slots=True)
class Subscribe(Command):
    correlation_id: int
    subscription_id: int
    stream: str
    offset_spec: OffsetSpec
    credit: int
    properties: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Credit(Command):
    subscription_id: int
    credit: int


@dataclass(frozen=True, slots=True)
class CreditResponse(Command):
    """Sent only on a problem (an unknown subscription); it has no correlation id."""

    response_code: int
    subscription_id: int


@dataclass(frozen=True, slots=True)
class Deliver(Command):
    """A chunk for a subscription. `chunk` is the osiris chunk, header and records, passed
    through as bytes; `committed_offset` exists on the wire only in version 2."""

    subscription_id: int
    chunk: bytes
    committed_offset: int = 0
    version: int = VERSION_1


@dataclass(frozen=True, slots=True)
class Unsubscribe(Command):
    correlation_id: int
    subscription_id: int


@dataclass(frozen=True, slots=True)
class StoreOffset(Command):
    reference: str
    stream: str
    offset: int


@dataclass(frozen=True, slots=True)
class QueryOffset(Command):
    correlation_id: int
    reference: str
    stream: str


@dataclass(frozen=True, slots=True)
class QueryOffsetResponse(Command):
    correlation_id: int
    response_code: int
    offset: int


@dataclass(frozen=True, slots=True)
class StreamStats(Command):
    correlation_id: int
    stream: str


@dataclass(frozen=True, slots=True)
class StreamStatsResponse(Command):
    correlation_id: int
    response_code: int
    stats: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExchangeCommandVersions(Command):
    correlation_id: int
    versions: tuple[CommandVersion, ...]


@dataclass(frozen=True, slots=True)
class ExchangeCommandVersionsResponse(Command):
    correlation_id: int
    response_code: int
    versions: tuple[CommandVersion, ...]


@dataclass(frozen=True, slots=True)
class ConsumerUpdate(Command):
    """Server to client: this single-active-consumer subscription became (in)active."""

    correlation_id: int
    subscription_id: int
    active: bool


@dataclass(frozen=True, slots=True)
class ConsumerUpdateResponse(Command):
    """Client to server: where the newly active consumer starts."""

    correlation_id: int
    response_code: int
    offset_spec: OffsetSpec


@dataclass(frozen=True, slots=True)
class Route(Command):
    correlation_id: int
    routing_key: str
    super_stream: str


@dataclass(frozen=True, slots=True)
class RouteResponse(Command):
    correlation_id: int
    response_code: int
    streams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Partitions(Command):
    correlation_id: int
    super_stream: str


@dataclass(frozen=True, slots=True)
class PartitionsResponse(Command):
    correlation_id: int
    response_code: int
    streams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CreateSuperStream(Command):
    """RabbitMQ 3.13: the super stream's exchange, partitions and their binding keys."""

    correlation_id: int
    super_stream: str
    partitions: tuple[str, ...]
    binding_keys: tuple[str, ...]
    arguments: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeleteSuperStream(Command):
    correlation_id: int
    super_stream: str
