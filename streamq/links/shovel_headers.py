"""The headers a shovel adds to what it forwards: RabbitMQ's `x-shovelled` and
`x-shovelled-timestamp` (`dest-add-forward-headers`, `dest-add-timestamp-header`).

Owns the rewrite of a message's encoded basic properties on its way through a shovel. It
must not touch connections; it is pure, and the clock is passed in.

As RabbitMQ's rabbit_shovel_util:update_headers: `x-shovelled` is an array of tables,
the newest first (a message shovelled twice carries both hops), each naming the shovel,
its vhost, its type ("dynamic"), the source and destination URIs without their
passwords, and the source queue or exchange and the destination queue or exchange.
`x-shovelled-timestamp` is the time of forwarding in seconds (an AMQP timestamp).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from amqp_gateway.codec.properties import decode_properties, encode_properties
from amqp_gateway.codec.values import FieldValue, Timestamp

FORWARD_HEADER = "x-shovelled"
TIMESTAMP_HEADER = "x-shovelled-timestamp"


def forward_record(
    name: str,
    vhost: str,
    node: str,
    endpoints: Mapping[str, str],
) -> dict[str, FieldValue]:
    """The table that `x-shovelled` gets for one hop: RabbitMQ's keys in its order.
    `endpoints` holds src-uri, dest-uri and the src-/dest- queue or exchange keys."""
    record: dict[str, FieldValue] = {
        "shovelled-by": node,
        "shovel-type": "dynamic",
        "shovel-name": name,
        "shovel-vhost": vhost,
    }
    record.update(endpoints)
    return record


def add_headers(
    properties_raw: bytes,
    forward: Mapping[str, FieldValue] | None,
    timestamp_s: int | None,
) -> bytes:
    """`properties_raw` with `forward` prepended to its `x-shovelled` array (when given)
    and `x-shovelled-timestamp` set to `timestamp_s` (when given).

    Raises AMQPSyntaxError for a malformed property list (the message is then forwarded
    as it came: see the caller)."""
    properties = decode_properties(properties_raw)
    headers: dict[str, FieldValue] = dict(properties.headers or {})
    if forward is not None:
        earlier = headers.get(FORWARD_HEADER)
        hops: list[FieldValue] = list(earlier) if isinstance(earlier, list | tuple) else []
        headers[FORWARD_HEADER] = [dict(forward), *hops]
    if timestamp_s is not None:
        headers[TIMESTAMP_HEADER] = Timestamp(timestamp_s)
    return encode_properties(dataclasses.replace(properties, headers=headers))
