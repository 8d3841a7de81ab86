"""Body layouts of every command: the bytes after `key | version`, per RabbitMQ.

Layouts follow `rabbit_stream_core.erl` where it and PROTOCOL.adoc differ; each such spot
says so. Decoders read from a `Reader` positioned after the header and leave the end
check to `frames.decode`; encoders append to a `Writer`. Neither knows about frame sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import (
    OFFSET_TYPES_WITH_VALUE,
    RESPONSE_FLAG,
    VERSION_1,
    VERSION_2,
    Key,
    OffsetType,
)
from stream_gateway.codec.errors import MalformedFrame
from stream_gateway.codec.wire import Reader, Writer

Decoder = Callable[[Reader, int], c.Command]

# -- shared parts ------------------------------------------------------------------------


def _strings(r: Reader, what: str) -> tuple[str, ...]:
    return tuple(r.string(what) for _ in range(r.count(what)))


def write_strings(w: Writer, values: tuple[str, ...]) -> None:
    w.i32(len(values))
    for value in values:
        w.string(value)


def _optional_map(r: Reader, what: str) -> dict[str, str]:
    # RabbitMQ omits an empty map entirely in Subscribe and OpenResponse (no count).
    return r.string_map(what) if r.remaining else {}


def write_optional_map(w: Writer, values: dict[str, str]) -> None:
    if values:
        w.string_map(values)


def _offset_type(r: Reader, *, allow_none: bool) -> OffsetType:
    raw = r.u16("offset type")
    if raw not in OffsetType.__members__.values() or (raw == OffsetType.NONE and not allow_none):
        raise MalformedFrame(f"unknown offset type {raw}")
    return OffsetType(raw)


def _offset_value(r: Reader, offset_type: OffsetType) -> int:
    if offset_type == OffsetType.TIMESTAMP:
        return r.i64("timestamp")
    return r.u64("offset")


def write_offset_spec(w: Writer, spec: c.OffsetSpec) -> None:
    w.u16(spec.offset_type)
    if spec.offset_type in OFFSET_TYPES_WITH_VALUE:
        assert spec.value is not None, spec
        if spec.offset_type == OffsetType.TIMESTAMP:
            w.i64(spec.value)
        else:
            w.u64(spec.value)
    elif spec.value is not None:
        # Some clients (rstream, Java) send 8 bytes after every offset type in a
        # ConsumerUpdate response; keeping the value round-trips that layout.
        w.u64(spec.value)


def _versions(r: Reader) -> tuple[c.CommandVersion, ...]:
    return tuple(
        c.CommandVersion(r.u16("key"), r.u16("min version"), r.u16("max version"))
        for _ in range(r.count("command versions"))
    )


def write_command_versions(w: Writer, versions: tuple[c.CommandVersion, ...]) -> None:
    w.i32(len(versions))
    for item in versions:
        w.u16(item.key)
        w.u16(item.version_min)
        w.u16(item.version_max)


# -- requests and one-way commands -------------------------------------------------------


def _declare_publisher(r: Reader, _v: int) -> c.Command:
    return c.DeclarePublisher(r.u32(), r.u8(), r.string("reference"), r.string("stream"))


def _publish(r: Reader, version: int) -> c.Command:
    publisher_id = r.u8("publisher id")
    messages = []
    for _ in range(r.count("messages")):
        publishing_id = r.u64("publishing id")
        filter_value = r.nullable_string("filter value") if version == VERSION_2 else None
        message = r.nullable_bytes("message")
        if message is None:
            raise MalformedFrame("publish: null message")
        messages.append(c.PublishedMessage(publishing_id, message, filter_value))
    return c.Publish(publisher_id, tuple(messages), version)


def _publish_confirm(r: Reader, _v: int) -> c.Command:
    publisher_id = r.u8("publisher id")
    return c.PublishConfirm(publisher_id, tuple(r.u64() for _ in range(r.count("ids"))))


def _publish_error(r: Reader, _v: int) -> c.Command:
    publisher_id = r.u8("publisher id")
    errors = tuple(c.PublishingError(r.u64(), r.u16()) for _ in range(r.count("errors")))
    return c.PublishError(publisher_id, errors)


def _query_publisher_sequence(r: Reader, _v: int) -> c.Command:
    return c.QueryPublisherSequence(r.u32(), r.string("reference"), r.string("stream"))


def _delete_publisher(r: Reader, _v: int) -> c.Command:
    return c.DeletePublisher(r.u32(), r.u8())


def _subscribe(r: Reader, _v: int) -> c.Command:
    correlation_id, subscription_id, stream = r.u32(), r.u8(), r.string("stream")
    offset_type = _offset_type(r, allow_none=False)
    value = _offset_value(r, offset_type) if offset_type in OFFSET_TYPES_WITH_VALUE else None
    credit = r.u16("credit")
    properties = _optional_map(r, "properties")
    spec = c.OffsetSpec(offset_type, value)
    return c.Subscribe(correlation_id, subscription_id, stream, spec, credit, properties)


def _deliver(r: Reader, version: int) -> c.Command:
    subscription_id = r.u8("subscription id")
    committed_offset = r.u64("committed offset") if version == VERSION_2 else 0
    return c.Deliver(subscription_id, r.rest(), committed_offset, version)


def _credit(r: Reader, _v: int) -> c.Command:
    # rabbit_stream_core reads credit as int16; clients send 0..32767, so uint16 agrees.
    return c.Credit(r.u8("subscription id"), r.u16("credit"))


def _store_offset(r: Reader, _v: int) -> c.Command:
    return c.StoreOffset(r.string("reference"), r.string("stream"), r.u64("offset"))


def _query_offset(r: Reader, _v: int) -> c.Command:
    return c.QueryOffset(r.u32(), r.string("reference"), r.string("stream"))


def _unsubscribe(r: Reader, _v: int) -> c.Command:
    return c.Unsubscribe(r.u32(), r.u8())


def _create(r: Reader, _v: int) -> c.Command:
    return c.Create(r.u32(), r.string("stream"), r.string_map("arguments"))


def _delete(r: Reader, _v: int) -> c.Command:
    return c.Delete(r.u32(), r.string("stream"))


def _metadata(r: Reader, _v: int) -> c.Command:
    return c.Metadata(r.u32(), _strings(r, "streams"))


def _metadata_update(r: Reader, _v: int) -> c.Command:
    return c.MetadataUpdate(r.u16("code"), r.string("stream"))


def _peer_properties(r: Reader, _v: int) -> c.Command:
    return c.PeerProperties(r.u32(), r.string_map("peer properties"))


def _sasl_handshake(r: Reader, _v: int) -> c.Command:
    return c.SaslHandshake(r.u32())


def _sasl_authenticate(r: Reader, _v: int) -> c.Command:
    return c.SaslAuthenticate(r.u32(), r.string("mechanism"), r.nullable_bytes("sasl data"))


def _tune(r: Reader, _v: int) -> c.Command:
    return c.Tune(r.u32("frame max"), r.u32("heartbeat"))


def _open(r: Reader, _v: int) -> c.Command:
    return c.Open(r.u32(), r.string("vhost"))


def _close(r: Reader, _v: int) -> c.Command:
    return c.Close(r.u32(), r.u16("closing code"), r.string("reason"))


def _heartbeat(_r: Reader, _v: int) -> c.Command:
    return c.Heartbeat()


def _route(r: Reader, _v: int) -> c.Command:
    return c.Route(r.u32(), r.string("routing key"), r.string("super stream"))


def _partitions(r: Reader, _v: int) -> c.Command:
    return c.Partitions(r.u32(), r.string("super stream"))


def _consumer_update(r: Reader, _v: int) -> c.Command:
    correlation_id, subscription_id, active = r.u32(), r.u8(), r.u8("active")
    if active > 1:
        raise MalformedFrame(f"consumer update: active must be 0 or 1, not {active}")
    return c.ConsumerUpdate(correlation_id, subscription_id, active == 1)


def _exchange_command_versions(r: Reader, _v: int) -> c.Command:
    return c.ExchangeCommandVersions(r.u32(), _versions(r))


def _stream_stats(r: Reader, _v: int) -> c.Command:
    return c.StreamStats(r.u32(), r.string("stream"))


def _create_super_stream(r: Reader, _v: int) -> c.Command:
    correlation_id, name = r.u32(), r.string("super stream")
    partitions, keys = _strings(r, "partitions"), _strings(r, "binding keys")
    return c.CreateSuperStream(correlation_id, name, partitions, keys, r.string_map("arguments"))


def _delete_super_stream(r: Reader, _v: int) -> c.Command:
    return c.DeleteSuperStream(r.u32(), r.string("super stream"))


# -- responses ---------------------------------------------------------------------------


def _plain_response(key: Key) -> Decoder:
    def decode(r: Reader, _v: int) -> c.Command:
        return c.Response(key, r.u32(), r.u16("response code"))

    return decode


def _peer_properties_response(r: Reader, _v: int) -> c.Command:
    return c.PeerPropertiesResponse(r.u32(), r.u16(), r.string_map("peer properties"))


def _sasl_handshake_response(r: Reader, _v: int) -> c.Command:
    return c.SaslHandshakeResponse(r.u32(), r.u16(), _strings(r, "mechanisms"))


def _sasl_authenticate_response(r: Reader, _v: int) -> c.Command:
    correlation_id, code = r.u32(), r.u16()
    # rabbit_stream_core writes a challenge only when there is one, with a uint16 length
    # (its ?STRING macro), although PROTOCOL.adoc types it as bytes (int32 length).
    challenge = r.raw(r.u16("challenge length"), "challenge") if r.remaining else b""
    return c.SaslAuthenticateResponse(correlation_id, code, challenge)


def _tune_response(r: Reader, _v: int) -> c.Command:
    return c.TuneResponse(r.u32("frame max"), r.u32("heartbeat"))


def _open_response(r: Reader, _v: int) -> c.Command:
    return c.OpenResponse(r.u32(), r.u16(), _optional_map(r, "connection properties"))


def _metadata_response(r: Reader, _v: int) -> c.Command:
    correlation_id = r.u32()
    brokers = tuple(
        c.Broker(r.u16("broker reference"), r.string("host"), r.u32("port"))
        for _ in range(r.count("brokers"))
    )
    streams = []
    for _ in range(r.count("stream metadata")):
        stream, code, leader = r.string("stream"), r.u16(), r.u16("leader")
        replicas = tuple(r.u16("replica") for _ in range(r.count("replicas")))
        streams.append(c.StreamMetadata(stream, code, leader, replicas))
    return c.MetadataResponse(correlation_id, brokers, tuple(streams))


def _query_publisher_sequence_response(r: Reader, _v: int) -> c.Command:
    return c.QueryPublisherSequenceResponse(r.u32(), r.u16(), r.u64("sequence"))


def _credit_response(r: Reader, _v: int) -> c.Command:
    return c.CreditResponse(r.u16("response code"), r.u8("subscription id"))


def _query_offset_response(r: Reader, _v: int) -> c.Command:
    return c.QueryOffsetResponse(r.u32(), r.u16(), r.u64("offset"))


def _stream_stats_response(r: Reader, _v: int) -> c.Command:
    correlation_id, code = r.u32(), r.u16()
    stats = {r.string("stat"): r.i64("stat value") for _ in range(r.count("stats"))}
    return c.StreamStatsResponse(correlation_id, code, stats)


def _exchange_command_versions_response(r: Reader, _v: int) -> c.Command:
    return c.ExchangeCommandVersionsResponse(r.u32(), r.u16(), _versions(r))


def _consumer_update_response(r: Reader, _v: int) -> c.Command:
    correlation_id, code = r.u32(), r.u16()
    offset_type = _offset_type(r, allow_none=True)
    has_value = offset_type in OFFSET_TYPES_WITH_VALUE or r.remaining
    value = _offset_value(r, offset_type) if has_value else None
    return c.ConsumerUpdateResponse(correlation_id, code, c.OffsetSpec(offset_type, value))


def _route_response(r: Reader, _v: int) -> c.Command:
    return c.RouteResponse(r.u32(), r.u16(), _strings(r, "streams"))


def _partitions_response(r: Reader, _v: int) -> c.Command:
    return c.PartitionsResponse(r.u32(), r.u16(), _strings(r, "streams"))


_REQUESTS: Final[dict[Key, Decoder]] = {
    Key.DECLARE_PUBLISHER: _declare_publisher,
    Key.PUBLISH: _publish,
    Key.PUBLISH_CONFIRM: _publish_confirm,
    Key.PUBLISH_ERROR: _publish_error,
    Key.QUERY_PUBLISHER_SEQUENCE: _query_publisher_sequence,
    Key.DELETE_PUBLISHER: _delete_publisher,
    Key.SUBSCRIBE: _subscribe,
    Key.DELIVER: _deliver,
    Key.CREDIT: _credit,
    Key.STORE_OFFSET: _store_offset,
    Key.QUERY_OFFSET: _query_offset,
    Key.UNSUBSCRIBE: _unsubscribe,
    Key.CREATE: _create,
    Key.DELETE: _delete,
    Key.METADATA: _metadata,
    Key.METADATA_UPDATE: _metadata_update,
    Key.PEER_PROPERTIES: _peer_properties,
    Key.SASL_HANDSHAKE: _sasl_handshake,
    Key.SASL_AUTHENTICATE: _sasl_authenticate,
    Key.TUNE: _tune,
    Key.OPEN: _open,
    Key.CLOSE: _close,
    Key.HEARTBEAT: _heartbeat,
    Key.ROUTE: _route,
    Key.PARTITIONS: _partitions,
    Key.CONSUMER_UPDATE: _consumer_update,
    Key.EXCHANGE_COMMAND_VERSIONS: _exchange_command_versions,
    Key.STREAM_STATS: _stream_stats,
    Key.CREATE_SUPER_STREAM: _create_super_stream,
    Key.DELETE_SUPER_STREAM: _delete_super_stream,
}

PLAIN_RESPONSE_KEYS: Final = frozenset(
    {
        Key.DECLARE_PUBLISHER,
        Key.DELETE_PUBLISHER,
        Key.SUBSCRIBE,
        Key.UNSUBSCRIBE,
        Key.CREATE,
        Key.DELETE,
        Key.CLOSE,
        Key.CREATE_SUPER_STREAM,
        Key.DELETE_SUPER_STREAM,
    }
)

_RESPONSES: Final[dict[Key, Decoder]] = {
    **{key: _plain_response(key) for key in PLAIN_RESPONSE_KEYS},
    Key.PEER_PROPERTIES: _peer_properties_response,
    Key.SASL_HANDSHAKE: _sasl_handshake_response,
    Key.SASL_AUTHENTICATE: _sasl_authenticate_response,
    Key.TUNE: _tune_response,
    Key.OPEN: _open_response,
    Key.METADATA: _metadata_response,
    Key.QUERY_PUBLISHER_SEQUENCE: _query_publisher_sequence_response,
    Key.CREDIT: _credit_response,
    Key.QUERY_OFFSET: _query_offset_response,
    Key.STREAM_STATS: _stream_stats_response,
    Key.EXCHANGE_COMMAND_VERSIONS: _exchange_command_versions_response,
    Key.CONSUMER_UPDATE: _consumer_update_response,
    Key.ROUTE: _route_response,
    Key.PARTITIONS: _partitions_response,
}

DECODERS: Final[dict[int, Decoder]] = {
    **{int(key): decoder for key, decoder in _REQUESTS.items()},
    **{key | RESPONSE_FLAG: decoder for key, decoder in _RESPONSES.items()},
}
"""Wire key (response bit included) -> body decoder."""

__all__ = ["DECODERS", "PLAIN_RESPONSE_KEYS", "VERSION_1", "Decoder"]
