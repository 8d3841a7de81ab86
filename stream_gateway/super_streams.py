"""Super stream commands: Route, Partitions, CreateSuperStream and DeleteSuperStream.

Owns the protocol side of super streams; their layout (a direct exchange with
`x-super-stream`, bindings with `x-stream-partition-order`) is the broker core's
(`streamq.broker.stream_definitions`), shared with the management API's endpoint.
Permissions are RabbitMQ's: Route and Partitions need read on the exchange, creating and
deleting need configure on the exchange and every partition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import Key, ResponseCode
from stream_gateway.errors import StreamError
from stream_gateway.streams import reply_after_sync
from streamq.broker import stream_definitions
from streamq.broker.errors import NotFound

if TYPE_CHECKING:
    from stream_gateway.session import StreamSession

OK: Final = ResponseCode.OK


def route(s: StreamSession, m: c.Route) -> None:
    s.check("read", m.super_stream)
    try:
        streams = stream_definitions.route(s.current_vhost(), m.super_stream, m.routing_key)
    except NotFound:
        raise StreamError(ResponseCode.STREAM_DOES_NOT_EXIST) from None
    s.send(c.RouteResponse(m.correlation_id, OK, tuple(streams)))


def partitions(s: StreamSession, m: c.Partitions) -> None:
    s.check("read", m.super_stream)
    try:
        streams = stream_definitions.partitions(s.current_vhost(), m.super_stream)
    except NotFound:
        raise StreamError(ResponseCode.STREAM_DOES_NOT_EXIST) from None
    s.send(c.PartitionsResponse(m.correlation_id, OK, tuple(streams)))


def create(s: StreamSession, m: c.CreateSuperStream) -> None:
    vhost = s.current_vhost()
    s.check("configure", m.super_stream)
    for partition in m.partitions:
        s.check("configure", partition)
    if m.super_stream in vhost.exchanges:
        raise StreamError(ResponseCode.STREAM_ALREADY_EXISTS)
    arguments = stream_definitions.stream_arguments(m.arguments)
    stream_definitions.create_super_stream(
        vhost, m.super_stream, m.partitions, m.binding_keys, arguments
    )
    reply_after_sync(s, c.Response(Key.CREATE_SUPER_STREAM, m.correlation_id, OK))


def delete(s: StreamSession, m: c.DeleteSuperStream) -> None:
    vhost = s.current_vhost()
    s.check("configure", m.super_stream)
    try:
        streams = stream_definitions.partitions(vhost, m.super_stream)
    except NotFound:
        raise StreamError(ResponseCode.STREAM_DOES_NOT_EXIST) from None
    for stream in streams:
        s.check("configure", stream)
    stream_definitions.delete_super_stream(vhost, m.super_stream)
    reply_after_sync(s, c.Response(Key.DELETE_SUPER_STREAM, m.correlation_id, OK))
