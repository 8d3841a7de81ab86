"""Which command runs which handler, in which connection state, and how a refusal looks.

Owns the transition table of the stream protocol's connection (h11's style: a command is
legal only in the states listed for it, anything else closes with UNKNOWN_FRAME, as
RabbitMQ's reader does) and the one place that turns a refused request into its response
frame with a code: each request's response layout has a code right after the correlation
id, and the responses that carry more get empty values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from stream_gateway import handshake, publishers, streams, subscriptions, super_streams
from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import Key, ResponseCode

if TYPE_CHECKING:
    from stream_gateway.session import State, StreamSession

# Any: each handler takes its own command class; the table pairs them by construction.
Handler = Callable[["StreamSession", Any], None]

_OPENED: Final = "opened"
_ANY: Final = "any"

_TABLE: Final[dict[type[c.Command], tuple[str, Handler]]] = {
    c.PeerProperties: ("peer_properties", handshake.peer_properties),
    c.SaslHandshake: ("sasl_handshake", handshake.sasl_handshake),
    c.SaslAuthenticate: ("sasl_authenticate", handshake.sasl_authenticate),
    c.Tune: ("tune", handshake.tune),
    c.TuneResponse: ("tune", handshake.tune),
    c.Open: ("open", handshake.open_vhost),
    c.Heartbeat: (_ANY, handshake.heartbeat),
    c.Close: (_ANY, handshake.close),
    c.Response: (_ANY, handshake.response),
    c.Create: (_OPENED, streams.create),
    c.Delete: (_OPENED, streams.delete),
    c.Metadata: (_OPENED, streams.metadata),
    c.StreamStats: (_OPENED, streams.stream_stats),
    c.QueryOffset: (_OPENED, streams.query_offset),
    c.StoreOffset: (_OPENED, streams.store_offset),
    c.ExchangeCommandVersions: (_OPENED, handshake.exchange_command_versions),
    c.DeclarePublisher: (_OPENED, publishers.declare),
    c.DeletePublisher: (_OPENED, publishers.delete),
    c.QueryPublisherSequence: (_OPENED, publishers.query_sequence),
    c.Subscribe: (_OPENED, subscriptions.subscribe),
    c.Unsubscribe: (_OPENED, subscriptions.unsubscribe),
    c.Credit: (_OPENED, subscriptions.credit),
    c.ConsumerUpdateResponse: (_OPENED, subscriptions.consumer_update_response),
    c.Route: (_OPENED, super_streams.route),
    c.Partitions: (_OPENED, super_streams.partitions),
    c.CreateSuperStream: (_OPENED, super_streams.create),
    c.DeleteSuperStream: (_OPENED, super_streams.delete),
}

_STATE_NAMES: Final = {
    "peer_properties": "PEER_PROPERTIES",
    "sasl_handshake": "SASL_HANDSHAKE",
    "sasl_authenticate": "SASL_AUTHENTICATE",
    "tune": "TUNE",
    "open": "OPEN",
    _OPENED: "OPENED",
}


def handler(state: State, command: c.Command) -> Handler | None:
    """The handler of `command` in `state`, None where it is not legal."""
    entry = _TABLE.get(type(command))
    if entry is None:
        return None
    where, run = entry
    if where == _ANY or state.name == _STATE_NAMES[where]:
        return run
    if where == "sasl_authenticate" and state.name == "SASL_HANDSHAKE":
        return run  # a client may skip the handshake once it knows the mechanisms
    return None


def publish(s: StreamSession, frame: bytes, version: int) -> None:
    publishers.publish(s, frame, version)


def refuse(s: StreamSession, command: c.Command, code: ResponseCode) -> None:
    """Answer `command` with `code` (one-way commands get nothing, except Credit: its
    response exists for that, and StoreOffset, which RabbitMQ ignores when refused)."""
    response = refusal(command, code)
    if response is not None:
        s.send(response)


def refusal(command: c.Command, code: ResponseCode) -> c.Command | None:
    correlation_id = getattr(command, "correlation_id", None)
    if isinstance(command, c.Credit):
        return c.CreditResponse(code, command.subscription_id)
    if correlation_id is None:
        return None
    if isinstance(command, c.Metadata):
        return None  # answered per stream, never refused as a whole
    if isinstance(command, c.QueryOffset):
        return c.QueryOffsetResponse(correlation_id, code, 0)
    if isinstance(command, c.QueryPublisherSequence):
        return c.QueryPublisherSequenceResponse(correlation_id, code, 0)
    if isinstance(command, c.StreamStats):
        return c.StreamStatsResponse(correlation_id, code)
    if isinstance(command, c.Route):
        return c.RouteResponse(correlation_id, code, ())
    if isinstance(command, c.Partitions):
        return c.PartitionsResponse(correlation_id, code, ())
    if isinstance(command, c.ExchangeCommandVersions):
        return c.ExchangeCommandVersionsResponse(correlation_id, code, ())
    if isinstance(command, c.PeerProperties):
        return c.PeerPropertiesResponse(correlation_id, code)
    if isinstance(command, c.SaslHandshake):
        return c.SaslHandshakeResponse(correlation_id, code)
    if isinstance(command, c.SaslAuthenticate):
        return c.SaslAuthenticateResponse(correlation_id, code)
    if isinstance(command, c.Open):
        return c.OpenResponse(correlation_id, code)
    if isinstance(command, c.ConsumerUpdateResponse):
        return None
    key = _PLAIN_KEYS.get(type(command))
    if key is None:
        return None
    return c.Response(key, correlation_id, code)


_PLAIN_KEYS: Final[dict[type[c.Command], Key]] = {
    c.DeclarePublisher: Key.DECLARE_PUBLISHER,
    c.DeletePublisher: Key.DELETE_PUBLISHER,
    c.Subscribe: Key.SUBSCRIBE,
    c.Unsubscribe: Key.UNSUBSCRIBE,
    c.Create: Key.CREATE,
    c.Delete: Key.DELETE,
    c.Close: Key.CLOSE,
    c.CreateSuperStream: Key.CREATE_SUPER_STREAM,
    c.DeleteSuperStream: Key.DELETE_SUPER_STREAM,
}

__all__ = ["handler", "publish", "refusal", "refuse"]
