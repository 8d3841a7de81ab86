"""Body encoders: each command's fields, in RabbitMQ's order, after `key | version`.

`ENCODERS` maps a command class to its wire key and body writer; `Response` takes its key
from the instance. The layouts mirror `bodies.py` (the decoders), quirk for quirk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from stream_gateway.codec import commands as c
from stream_gateway.codec.bodies import (
    write_command_versions,
    write_offset_spec,
    write_optional_map,
    write_strings,
)
from stream_gateway.codec.constants import RESPONSE_FLAG, VERSION_2, Key
from stream_gateway.codec.wire import Writer

# Any: each writer takes its own command class; the table pairs them by construction.
BodyWriter = Callable[[Writer, Any], None]


def _declare_publisher(w: Writer, m: c.DeclarePublisher) -> None:
    w.u32(m.correlation_id)
    w.u8(m.publisher_id)
    w.string(m.reference)
    w.string(m.stream)


def _publish(w: Writer, m: c.Publish) -> None:
    w.u8(m.publisher_id)
    w.i32(len(m.messages))
    for item in m.messages:
        w.u64(item.publishing_id)
        if m.version == VERSION_2:
            w.nullable_string(item.filter_value)
        else:
            assert item.filter_value is None, "a filter value needs Publish version 2"
        w.nullable_bytes(item.message)


def _publish_confirm(w: Writer, m: c.PublishConfirm) -> None:
    w.u8(m.publisher_id)
    w.i32(len(m.publishing_ids))
    for publishing_id in m.publishing_ids:
        w.u64(publishing_id)


def _publish_error(w: Writer, m: c.PublishError) -> None:
    w.u8(m.publisher_id)
    w.i32(len(m.errors))
    for error in m.errors:
        w.u64(error.publishing_id)
        w.u16(error.response_code)


def _reference_stream(w: Writer, m: c.QueryPublisherSequence | c.QueryOffset) -> None:
    w.u32(m.correlation_id)
    w.string(m.reference)
    w.string(m.stream)


def _correlated_id8(w: Writer, m: c.DeletePublisher | c.Unsubscribe) -> None:
    w.u32(m.correlation_id)
    w.u8(m.publisher_id if isinstance(m, c.DeletePublisher) else m.subscription_id)


def _subscribe(w: Writer, m: c.Subscribe) -> None:
    w.u32(m.correlation_id)
    w.u8(m.subscription_id)
    w.string(m.stream)
    write_offset_spec(w, m.offset_spec)
    w.u16(m.credit)
    write_optional_map(w, m.properties)


def _deliver(w: Writer, m: c.Deliver) -> None:
    w.u8(m.subscription_id)
    if m.version == VERSION_2:
        w.u64(m.committed_offset)
    w.raw(m.chunk)


def _credit(w: Writer, m: c.Credit) -> None:
    w.u8(m.subscription_id)
    w.u16(m.credit)


def _store_offset(w: Writer, m: c.StoreOffset) -> None:
    w.string(m.reference)
    w.string(m.stream)
    w.u64(m.offset)


def _create(w: Writer, m: c.Create) -> None:
    w.u32(m.correlation_id)
    w.string(m.stream)
    w.string_map(m.arguments)


def _correlated_stream(w: Writer, m: c.Delete | c.StreamStats) -> None:
    w.u32(m.correlation_id)
    w.string(m.stream)


def _metadata(w: Writer, m: c.Metadata) -> None:
    w.u32(m.correlation_id)
    write_strings(w, m.streams)


def _metadata_update(w: Writer, m: c.MetadataUpdate) -> None:
    w.u16(m.response_code)
    w.string(m.stream)


def _peer_properties(w: Writer, m: c.PeerProperties) -> None:
    w.u32(m.correlation_id)
    w.string_map(m.properties)


def _sasl_handshake(w: Writer, m: c.SaslHandshake) -> None:
    w.u32(m.correlation_id)


def _sasl_authenticate(w: Writer, m: c.SaslAuthenticate) -> None:
    w.u32(m.correlation_id)
    w.string(m.mechanism)
    w.nullable_bytes(m.data)


def _tune(w: Writer, m: c.Tune | c.TuneResponse) -> None:
    w.u32(m.frame_max)
    w.u32(m.heartbeat_s)


def _open(w: Writer, m: c.Open) -> None:
    w.u32(m.correlation_id)
    w.string(m.vhost)


def _close(w: Writer, m: c.Close) -> None:
    w.u32(m.correlation_id)
    w.u16(m.closing_code)
    w.string(m.reason)


def _heartbeat(_w: Writer, _m: c.Heartbeat) -> None:
    pass


def _route(w: Writer, m: c.Route) -> None:
    w.u32(m.correlation_id)
    w.string(m.routing_key)
    w.string(m.super_stream)


def _partitions(w: Writer, m: c.Partitions) -> None:
    w.u32(m.correlation_id)
    w.string(m.super_stream)


def _consumer_update(w: Writer, m: c.ConsumerUpdate) -> None:
    w.u32(m.correlation_id)
    w.u8(m.subscription_id)
    w.u8(int(m.active))


def _exchange_command_versions(w: Writer, m: c.ExchangeCommandVersions) -> None:
    w.u32(m.correlation_id)
    write_command_versions(w, m.versions)


def _create_super_stream(w: Writer, m: c.CreateSuperStream) -> None:
    w.u32(m.correlation_id)
    w.string(m.super_stream)
    write_strings(w, m.partitions)
    write_strings(w, m.binding_keys)
    w.string_map(m.arguments)


def _delete_super_stream(w: Writer, m: c.DeleteSuperStream) -> None:
    w.u32(m.correlation_id)
    w.string(m.super_stream)


def _response(w: Writer, m: c.Response) -> None:
    w.u32(m.correlation_id)
    w.u16(m.response_code)


def _peer_properties_response(w: Writer, m: c.PeerPropertiesResponse) -> None:
    _response_head(w, m.correlation_id, m.response_code)
    w.string_map(m.properties)


def _sasl_handshake_response(w: Writer, m: c.SaslHandshakeResponse) -> None:
    _response_head(w, m.correlation_id, m.response_code)
    write_strings(w, m.mechanisms)


def _sasl_authenticate_response(w: Writer, m: c.SaslAuthenticateResponse) -> None:
    _response_head(w, m.correlation_id, m.response_code)
    if m.challenge:
        # uint16 length, as rabbit_stream_core writes it (see bodies.py).
        assert len(m.challenge) <= 0xFFFF
        w.u16(len(m.challenge))
        w.raw(m.challenge)


def _open_response(w: Writer, m: c.OpenResponse) -> None:
    _response_head(w, m.correlation_id, m.response_code)
    write_optional_map(w, m.properties)


def _metadata_response(w: Writer, m: c.MetadataResponse) -> None:
    w.u32(m.correlation_id)
    w.i32(len(m.brokers))
    for broker in m.brokers:
        w.u16(broker.reference)
        w.string(broker.host)
        w.u32(broker.port)
    w.i32(len(m.streams))
    for item in m.streams:
        w.string(item.stream)
        w.u16(item.response_code)
        w.u16(item.leader_reference)
        w.i32(len(item.replica_references))
        for replica in item.replica_references:
            w.u16(replica)


def _query_publisher_sequence_response(w: Writer, m: c.QueryPublisherSequenceResponse) -> None:
    _response_head(w, m.correlation_id, m.response_code)
    w.u64(m.sequence)


def _credit_response(w: Writer, m: c.CreditResponse) -> None:
    w.u16(m.response_code)
    w.u8(m.subscription_id)


def _query_offset_response(w: Writer, m: c.QueryOffsetResponse) -> None:
    _response_head(w, m.correlation_id, m.response_code)
    w.u64(m.offset)


def _stream_stats_response(w: Writer, m: c.StreamStatsResponse) -> None:
    _response_head(w, m.correlation_id, m.response_code)
    w.i32(len(m.stats))
    for name, value in m.stats.items():
        w.string(name)
        w.i64(value)


def _exchange_command_versions_response(w: Writer, m: c.ExchangeCommandVersionsResponse) -> None:
    _response_head(w, m.correlation_id, m.response_code)
    write_command_versions(w, m.versions)


def _consumer_update_response(w: Writer, m: c.ConsumerUpdateResponse) -> None:
    _response_head(w, m.correlation_id, m.response_code)
    write_offset_spec(w, m.offset_spec)


def _streams_response(w: Writer, m: c.RouteResponse | c.PartitionsResponse) -> None:
    _response_head(w, m.correlation_id, m.response_code)
    write_strings(w, m.streams)


def _response_head(w: Writer, correlation_id: int, response_code: int) -> None:
    w.u32(correlation_id)
    w.u16(response_code)


def _r(key: Key) -> int:
    return key | RESPONSE_FLAG


ENCODERS: Final[dict[type[c.Command], tuple[int, BodyWriter]]] = {
    c.DeclarePublisher: (Key.DECLARE_PUBLISHER, _declare_publisher),
    c.Publish: (Key.PUBLISH, _publish),
    c.PublishConfirm: (Key.PUBLISH_CONFIRM, _publish_confirm),
    c.PublishError: (Key.PUBLISH_ERROR, _publish_error),
    c.QueryPublisherSequence: (Key.QUERY_PUBLISHER_SEQUENCE, _reference_stream),
    c.DeletePublisher: (Key.DELETE_PUBLISHER, _correlated_id8),
    c.Subscribe: (Key.SUBSCRIBE, _subscribe),
    c.Deliver: (Key.DELIVER, _deliver),
    c.Credit: (Key.CREDIT, _credit),
    c.StoreOffset: (Key.STORE_OFFSET, _store_offset),
    c.QueryOffset: (Key.QUERY_OFFSET, _reference_stream),
    c.Unsubscribe: (Key.UNSUBSCRIBE, _correlated_id8),
    c.Create: (Key.CREATE, _create),
    c.Delete: (Key.DELETE, _correlated_stream),
    c.Metadata: (Key.METADATA, _metadata),
    c.MetadataUpdate: (Key.METADATA_UPDATE, _metadata_update),
    c.PeerProperties: (Key.PEER_PROPERTIES, _peer_properties),
    c.SaslHandshake: (Key.SASL_HANDSHAKE, _sasl_handshake),
    c.SaslAuthenticate: (Key.SASL_AUTHENTICATE, _sasl_authenticate),
    c.Tune: (Key.TUNE, _tune),
    c.Open: (Key.OPEN, _open),
    c.Close: (Key.CLOSE, _close),
    c.Heartbeat: (Key.HEARTBEAT, _heartbeat),
    c.Route: (Key.ROUTE, _route),
    c.Partitions: (Key.PARTITIONS, _partitions),
    c.ConsumerUpdate: (Key.CONSUMER_UPDATE, _consumer_update),
    c.ExchangeCommandVersions: (Key.EXCHANGE_COMMAND_VERSIONS, _exchange_command_versions),
    c.StreamStats: (Key.STREAM_STATS, _correlated_stream),
    c.CreateSuperStream: (Key.CREATE_SUPER_STREAM, _create_super_stream),
    c.DeleteSuperStream: (Key.DELETE_SUPER_STREAM, _delete_super_stream),
    # Response's key comes from the instance; 0 is a placeholder that encode() replaces.
    c.Response: (0, _response),
    c.PeerPropertiesResponse: (_r(Key.PEER_PROPERTIES), _peer_properties_response),
    c.SaslHandshakeResponse: (_r(Key.SASL_HANDSHAKE), _sasl_handshake_response),
    c.SaslAuthenticateResponse: (_r(Key.SASL_AUTHENTICATE), _sasl_authenticate_response),
    c.TuneResponse: (_r(Key.TUNE), _tune),
    c.OpenResponse: (_r(Key.OPEN), _open_response),
    c.MetadataResponse: (_r(Key.METADATA), _metadata_response),
    c.QueryPublisherSequenceResponse: (
        _r(Key.QUERY_PUBLISHER_SEQUENCE),
        _query_publisher_sequence_response,
    ),
    c.CreditResponse: (_r(Key.CREDIT), _credit_response),
    c.QueryOffsetResponse: (_r(Key.QUERY_OFFSET), _query_offset_response),
    c.StreamStatsResponse: (_r(Key.STREAM_STATS), _stream_stats_response),
    c.ExchangeCommandVersionsResponse: (
        _r(Key.EXCHANGE_COMMAND_VERSIONS),
        _exchange_command_versions_response,
    ),
    c.ConsumerUpdateResponse: (_r(Key.CONSUMER_UPDATE), _consumer_update_response),
    c.RouteResponse: (_r(Key.ROUTE), _streams_response),
    c.PartitionsResponse: (_r(Key.PARTITIONS), _streams_response),
}
