"""Federation's names and headers, as RabbitMQ's federation plugin writes them.

Owns the pure parts of a federation link: the names of what a link declares on its
upstream (the queue `federation: X -> node[:...]` and its internal exchange `... A`/`... B`,
rabbit_federation_exchange_link:upstream_queue_name/3 and upstream_exchange_name/2), the
`x-received-from` header a federated message gains at each hop and the `max-hops` rule
that drops a message which has travelled far enough (rabbit_federation_util:should_forward/4),
and the `x-bound-from` argument a binding gains as it propagates upstream, with its hop
count (update_binding/2). No I/O, no broker state: the links call these per message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final, cast
from urllib.parse import urlsplit, urlunsplit

from amqp_gateway import codec
from amqp_gateway.codec.values import write_table

# Flag bits of the basic properties (spec 4.2.6.1; amqp_gateway.codec.properties).
_CONTENT_TYPE_FLAG: Final = 0x8000
_CONTENT_ENCODING_FLAG: Final = 0x4000
_HEADERS_FLAG: Final = 0x2000
_USER_ID_FLAG: Final = 0x0010
RECEIVED_FROM: Final = "x-received-from"  # RabbitMQ's ?ROUTING_HEADER
BOUND_FROM: Final = "x-bound-from"  # RabbitMQ's ?BINDING_HEADER
INTERNAL_PURPOSE: Final = {"x-internal-purpose": "federation"}
# A header array longer than this is not ours to trust: the message is dropped (a loop
# the hop rule could not stop, or a forged header), so each hop's decode stays bounded.
RECEIVED_FROM_ENTRIES_MAX: Final = 255


def upstream_queue_name(
    upstream_exchange: str, upstream_vhost: str, down_exchange: str, down_vhost: str, node: str
) -> str:
    """The queue an exchange link declares on its upstream (RabbitMQ's naming)."""
    if down_vhost == upstream_vhost:
        down_part = "" if down_exchange == upstream_exchange else f":{down_exchange}"
    else:
        down_part = f":{down_vhost}:{down_exchange}"
    return f"federation: {upstream_exchange} -> {node}{down_part}"


def internal_exchange_name(upstream_queue: str, suffix: str) -> str:
    """The upstream exchange the link's bindings go to; the suffix ("A" or "B") swaps at
    each connection, so that the new bindings are in place before the old ones go."""
    return f"{upstream_queue} {suffix}"


def without_credentials(uri: str) -> str:
    """The URI without its user information, as RabbitMQ shows an upstream's URI in
    `x-received-from` and the link status (rabbit_federation_upstream:remove_credentials)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "(a URI that cannot be shown)"
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=netloc))


def should_forward(headers: Mapping[str, object] | None, max_hops: int) -> bool:
    """Whether a message from the upstream may enter the downstream: it has made fewer
    than `max_hops` hops (RabbitMQ's should_forward/4 without its cluster-name check:
    streamq brokers announce no cluster name, so the hop count is what stops a ring)."""
    if not headers:
        return True
    entries = headers.get(RECEIVED_FROM)
    if not isinstance(entries, list):
        return True
    return len(entries) < max_hops and len(entries) <= RECEIVED_FROM_ENTRIES_MAX


def received_from_entry(uri: str, kind: str, name: str, redelivered: bool) -> codec.FieldTable:
    """One hop's entry: the upstream's URI (password redacted), its exchange or queue
    (`kind`), and whether the upstream redelivered the message."""
    return {"uri": uri, kind: name, "redelivered": redelivered}


def encoded_hop(entry: codec.FieldTable) -> bytes:
    """The headers table `{x-received-from: [entry]}` in its wire form (with its length),
    for `splice_received_from`."""
    out = bytearray()
    write_table(out, {RECEIVED_FROM: [entry]})
    return bytes(out)


def splice_received_from(properties_raw: bytes, hop_table: bytes) -> bytes | None:
    """The per-message fast path of `add_received_from`: properties without headers and
    without user-id (most messages) get the headers table `hop_table` (`encoded_hop`)
    spliced in, without decoding anything else. None: take the slow path (there are
    headers to read, or a user-id to look at, or the bytes are malformed)."""
    if len(properties_raw) < 2:
        return None
    flags = (properties_raw[0] << 8) | properties_raw[1]
    if flags & (_HEADERS_FLAG | _USER_ID_FLAG):
        return None
    position = 2
    for flag in (_CONTENT_TYPE_FLAG, _CONTENT_ENCODING_FLAG):
        if flags & flag:
            if position >= len(properties_raw):
                return None
            position += 1 + properties_raw[position]
    if position > len(properties_raw):
        return None
    flags |= _HEADERS_FLAG
    return b"".join(
        (
            bytes((flags >> 8, flags & 0xFF)),
            properties_raw[2:position],
            hop_table,
            properties_raw[position:],
        )
    )


def add_received_from(properties: codec.BasicProperties, entry: codec.FieldTable) -> bytes:
    """The properties' wire form with `entry` first in `x-received-from` (RabbitMQ
    prepends: the newest hop first). Raises ValueError for properties that cannot be
    encoded again."""
    headers: codec.FieldTable = dict(properties.headers or {})
    previous = headers.get(RECEIVED_FROM)
    hops: list[codec.FieldValue] = [entry]
    if isinstance(previous, list):
        hops.extend(previous)
    headers[RECEIVED_FROM] = hops
    return codec.encode_properties(dataclasses.replace(properties, headers=headers))


def bound_arguments(
    arguments: Mapping[str, object],
    max_hops: int,
    down_vhost: str,
    down_exchange: str,
    suffix: str,
    node: str,
) -> codec.FieldTable | None:
    """The arguments of a downstream binding as it goes upstream: its `x-bound-from`
    gains this hop (hops left: this upstream's max-hops, or one fewer than the hop it
    came from, whichever is less). None: it has gone as far as messages may come."""
    previous = arguments.get(BOUND_FROM)
    hops = max_hops
    if isinstance(previous, list) and previous:
        first = previous[0]
        prev_hops = first.get("hops") if isinstance(first, dict) else None
        hops = min((prev_hops if isinstance(prev_hops, int) else 0) - 1, max_hops)
    if hops <= 0:
        return None
    info: codec.FieldTable = {
        "cluster-name": node,
        "vhost": down_vhost,
        "exchange": f"{down_vhost}:{down_exchange} {suffix}",
        "hops": codec.Int16(hops),
    }
    # Like the arguments, an array that came in over AMQP holds field values.
    earlier = cast(codec.FieldArray, previous) if isinstance(previous, list) else []
    out = as_table(arguments)
    out[BOUND_FROM] = [info, *earlier]
    return out


def as_table(arguments: Mapping[str, object]) -> codec.FieldTable:
    """Arguments the broker holds (they came in as AMQP field values, or from JSON of the
    same types) as a table to send."""
    return cast(codec.FieldTable, dict(arguments))


def thaw_arguments(frozen: tuple[tuple[str, object], ...]) -> dict[str, object]:
    """A binding's arguments back as a table (`exchange.freeze_arguments` made them
    hashable: tables became sorted pairs, arrays tuples). A nested tuple of (str, value)
    pairs reads as a table, any other tuple as an array."""
    return {key: _thaw(value) for key, value in frozen}


def _thaw(value: object) -> object:
    if not isinstance(value, tuple):
        return value
    if value and all(isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in value):
        return {k: _thaw(v) for k, v in value}
    return [_thaw(v) for v in value]
